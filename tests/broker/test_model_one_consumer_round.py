"""A delivery round from a backlog that only one consumer has room for (the round an ack read starts) is
one run to that consumer without ``ConsumerSet.pick``, and gives every consumer and channel exactly what
one delivery at a time gives: the same messages, tags and order, the same windows, and the same ring order
for the rounds after it (one consumer with room for several, for one, two consumers with room, all)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lavinpy.broker.queues.base import DELIVERY_BATCH
from lavinpy.broker.queues.consumer import Consumer
from lavinpy.broker.queues.consumer_set import ConsumerSet
from tests.broker.model_harness import Model, run
from tests.broker.test_model_consumer_runs import RecordingChannel

PREFETCHES = {"a": 2, "b": 3, "c": 4, "d": 1}
# the credits given back before each delivery turn: one consumer (room for several, for one), two, all
CREDITS = [{"b": 2}, {"c": 1}, {"a": 1, "c": 2}, {"d": 1}, {"b": 1}, {"a": 2, "b": 3, "c": 4, "d": 1},
           {"c": 3}, {"a": 1}, {"a": 1, "b": 2, "c": 1, "d": 1}, {"b": 3}, {"d": 1}]


def scenario(m: Model, one_at_a_time: bool, picks: list[int]
             ) -> tuple[dict[str, list[tuple[int, str, bytes]]], list[int], int, list[int]]:
    """Four consumers on channels of their own, their windows filled from a published run and a backlog
    left; then the credits above, each followed by the queue's delivery turns. Returns each channel's
    deliveries, how many each turn delivered, the ready count at the end and how many ``pick`` calls
    each turn made (``picks`` has one entry per call)."""
    vhost = m.vhost
    if one_at_a_time:  # the reference: one delivery at a time (as while a channel-wide prefetch exists)
        vhost.channel_wide_prefetches += 1
    room = DELIVERY_BATCH - 1 if one_at_a_time else 1 << 30
    queue = m.declare("work")
    channels = {name: RecordingChannel(name, room) for name in PREFETCHES}
    consumers = {name: Consumer(name, queue, channels[name], prefetch=prefetch)  # type: ignore[arg-type]
                 for name, prefetch in PREFETCHES.items()}
    for consumer in consumers.values():
        queue.add_consumer(consumer)
    bodies = [b"m%d" % i for i in range(80)]
    assert vhost.publish_run(vhost.default_exchange, "work", b"\x00\x00", bodies) == (1, False)
    delivered = []
    calls = []
    for credits in CREDITS:
        for name, count in credits.items():
            consumers[name].credit(count)
        before = sum(len(channel.delivered) for channel in channels.values())
        called = len(picks)
        while queue.deliver():
            pass
        delivered.append(sum(len(channel.delivered) for channel in channels.values()) - before)
        calls.append(len(picks) - called)
    vhost.channel_wide_prefetches -= one_at_a_time
    return {name: channel.delivered for name, channel in channels.items()}, delivered, queue.message_count, calls


def test_a_round_for_one_consumer_keeps_the_round_robin_and_the_order(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    picks: list[int] = []
    pick = ConsumerSet.pick

    def counted(self: ConsumerSet, limit: int) -> Any:
        picks.append(limit)
        return pick(self, limit)

    monkeypatch.setattr(ConsumerSet, "pick", counted)
    results = []
    for one_at_a_time in (True, False):
        async def body(m: Model, one_at_a_time: bool = one_at_a_time) -> None:
            results.append(scenario(m, one_at_a_time, picks))
        run(body, tmp_path / str(one_at_a_time))
    (reference, reference_turns, reference_ready, _calls), (rounds, turns, ready, calls) = results
    assert rounds == reference and turns == reference_turns and ready == reference_ready
    # the scenario reaches what it is about: a backlog all along, rounds for one consumer with room for
    # several and for one, and the channels' deliveries interleaved by the round robin
    assert ready > 0 and turns[:2] == [2, 1]
    assert all(len(delivered) > PREFETCHES[name] for name, delivered in reference.items())
    # only the rounds that served several consumers picked through ``pick`` (after the two first picks)
    assert calls == [int(len(credits) > 1) for credits in CREDITS]
