"""A pick's walk of a queue's consumers in one compiled call (``_cwire.pick_scan``) and its pure twin
(``consumer_set._scan_py``) give the same consumers with room, the same rooms, park the same ones and
leave the same turn order, whatever the AMQP channels' states the compiled call reads from their members
(flow, closing, the connection's writable flag, replies waiting, the channel-wide prefetch) and the
consumers' own windows (no-ack, no prefetch, full, overfull), with another channel kind among them (its
``can_deliver`` called). Skipped on the pure path (nothing compiled to compare)."""

from __future__ import annotations

import random
from collections import OrderedDict, deque
from pathlib import Path
from typing import Any

import pytest
from pamqp import commands
from session_client import Harness

from lavinpy.broker.queues.consumer import Consumer
from lavinpy.broker.queues.consumer_set import ConsumerSet, _scan_py
from lavinpy.wire import accel

pytestmark = pytest.mark.skipif(not accel.COMPILED, reason="the pure-Python path is selected")


class OtherChannel:
    """Another channel kind: its own ``can_deliver``."""

    def __init__(self, open_: bool) -> None:
        self.open = open_

    def can_deliver(self) -> bool:
        return self.open


def _consumers(path: Path, count: int) -> tuple[Harness, list[Any]]:
    harness = Harness(path)
    harness.open_client(declare=commands.Queue.Declare(queue="work"))
    for i in range(count // 2):
        client = harness.connect()
        client.handshake()
        for channel in (1, 2):
            client.open_channel(channel)
            client.send((channel, commands.Basic.Consume(queue="work", consumer_tag=f"c{i}.{channel}")))
            client.read()
    return harness, list(harness.broker.vhosts["/"].queues["work"].consumers)


def test_the_compiled_scan_is_the_one_selected() -> None:
    from lavinpy.broker.queues import consumer_set
    assert consumer_set._scan is accel.cwire.pick_scan


@pytest.mark.parametrize("seed", range(4))
def test_compiled_and_pure_scans_agree_on_every_channel_and_window_state(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    harness, consumers = _consumers(tmp_path, 16)
    channels = list(dict.fromkeys(consumer.channel for consumer in consumers))
    others = [Consumer(f"o{i}", consumers[0].queue, OtherChannel(i % 2 == 0), prefetch=3) for i in range(4)]
    every = consumers + others
    for _ in range(200):
        for channel in channels:
            channel.flow_active = rng.random() > 0.1
            channel.closing = rng.random() < 0.1
            channel.conn.writable = rng.random() > 0.1
            channel.replies._replies = deque([object()]) if rng.random() < 0.1 else rng.choice([None, deque()])
            channel.deliveries.prefetch = rng.choice([0, 0, 2, 5])
            channel.deliveries.unacked = [None] * rng.choice([0, 1, 2, 5, 6])
        for consumer in every:
            consumer.no_ack = rng.random() < 0.1
            consumer.prefetch = rng.choice([0, 1, 3, 10])
            consumer.unacked = rng.randint(0, 12)
            consumer.parked = None
        for other in others:
            other.channel.open = rng.random() < 0.5
        order = rng.sample(every, rng.randint(0, len(every)))
        limit = rng.randint(1, 25)
        results = []
        for scan in (accel.cwire.pick_scan, _scan_py):
            for consumer in every:
                consumer.parked = None
            owner = ConsumerSet()
            queue: OrderedDict[Any, None] = OrderedDict.fromkeys(order)
            active, rooms = scan(queue, limit, owner)
            parked = [consumer for consumer in every if consumer.parked is owner]
            results.append(([c.tag for c in active], rooms, [c.tag for c in queue], [c.tag for c in parked]))
        assert results[0] == results[1]
    harness.close()
