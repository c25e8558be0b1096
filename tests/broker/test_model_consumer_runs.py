"""Several consumers of one classic queue served in delivery runs: a published run handed to them in hand
(``Queue.push_many``) and ready messages delivered from the index (``Queue.deliver``) give each consumer
exactly the messages, and each channel exactly the tags and order, that one delivery at a time gives:
the round robin, prefetch windows (1 among them), no-ack consumers and two consumers sharing a channel.

The reference is the same model taking its one-at-a-time paths, which it takes while a channel-wide
prefetch exists in the vhost (a pick must then see the deliveries before it on its channel): a vhost
that counts one, with channels whose room never limits, runs the same scenario one message at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lavinpy.broker.queues.base import DELIVERY_BATCH, RUN_SHARE
from lavinpy.broker.queues.consumer import Consumer
from lavinpy.store.record import StoredMessage
from tests.broker.model_harness import Model, run


class RecordingChannel:
    """A channel as a queue delivers to it: tags numbered per channel, every delivery recorded as
    (tag, consumer tag, body)."""

    def __init__(self, name: str, room: int) -> None:
        self.name = name
        self.room = room
        self.tag = 0
        self.delivered: list[tuple[int, str, bytes]] = []
        self.runs = 0  # calls that delivered (deliver or deliver_run)

    def can_deliver(self) -> bool:
        return True

    def delivery_room(self) -> int:
        return self.room

    def deliver(self, consumer: Any, pos: int, msg: StoredMessage, redelivered: bool) -> None:
        self.tag += 1
        self.delivered.append((self.tag, consumer.tag, bytes(msg.body)))
        self.runs += 1

    def deliver_run(self, consumer: Any, positions: list[int], messages: list[StoredMessage],
                    redelivered: list[bool] | None) -> None:
        assert len(positions) == len(messages) and (redelivered is None or len(redelivered) == len(messages))
        for msg in messages:
            self.tag += 1
            self.delivered.append((self.tag, consumer.tag, bytes(msg.body)))
        self.runs += 1

    def consumer_cancelled(self, consumer: Any) -> None:
        raise AssertionError("not cancelled in these tests")


def scenario(m: Model, one_at_a_time: bool) -> tuple[dict[str, list[tuple[int, str, bytes]]], dict[str, int], int]:
    """Consumers with prefetch 1, 3, 8 and 5 (the last two on one channel) and a no-ack one; published
    runs in hand, credit given back in between, a backlog delivered from the index. Returns each channel's
    deliveries, each consumer's unacked count and the queue's ready count at the end."""
    vhost = m.vhost
    # The one-at-a-time paths: a channel-wide prefetch counted in the vhost, with room for everything
    # on the channel (so the two paths see the same windows), but less than a delivery batch (``deliver``
    # takes its one-at-a-time loop only when a channel's room is below the batch).
    if one_at_a_time:
        vhost.channel_wide_prefetches += 1
    room = DELIVERY_BATCH - 1 if one_at_a_time else 1 << 30
    queue = m.declare("work")
    channels = {name: RecordingChannel(name, room) for name in ("a", "b", "cd", "e")}
    consumers = [
        Consumer("one", queue, channels["a"], prefetch=1),  # type: ignore[arg-type]
        Consumer("three", queue, channels["b"], prefetch=3),  # type: ignore[arg-type]
        Consumer("c", queue, channels["cd"], prefetch=8),  # type: ignore[arg-type]
        Consumer("d", queue, channels["cd"], prefetch=5),  # type: ignore[arg-type]
        Consumer("noack", queue, channels["e"], no_ack=True),  # type: ignore[arg-type]
    ]
    for consumer in consumers:
        queue.add_consumer(consumer)
    exchange = vhost.default_exchange
    props = b"\x00\x00"  # no properties
    serial = 0

    def publish_run(count: int) -> None:
        nonlocal serial
        bodies = [b"m%d" % (serial + i) for i in range(count)]
        serial += count
        assert vhost.publish_run(exchange, "work", props, bodies) == (1, False)

    publish_run(7)  # fewer than the consumers can take
    queue.remove_consumer(consumers[4])  # (a no-ack consumer's window never fills)
    publish_run(40)  # the windows fill; the rest waits in the index
    consumers[0].credit(1)
    consumers[1].credit(2)
    consumers[3].credit(4)
    while queue.deliver():  # from the index, as the scheduler's turns would
        pass
    publish_run(3)  # into a queue with a backlog: the index, in order
    for consumer in consumers[:3]:
        consumer.credit(consumer.unacked)
    while queue.deliver():
        pass
    vhost.channel_wide_prefetches -= one_at_a_time
    return ({name: ch.delivered for name, ch in channels.items()}, {c.tag: c.unacked for c in consumers},
            queue.message_count)


Delivered = dict[str, list[tuple[int, str, bytes]]]


def by_consumer(delivered: Delivered) -> dict[str, tuple[dict[str, list[bytes]], list[int]]]:
    """Each channel's deliveries as each consumer's bodies in order, and the channel's tags in order."""
    out: dict[str, tuple[dict[str, list[bytes]], list[int]]] = {}
    for name, entries in delivered.items():
        bodies: dict[str, list[bytes]] = {}
        for _tag, consumer, body in entries:
            bodies.setdefault(consumer, []).append(body)
        out[name] = (bodies, [tag for tag, _consumer, _body in entries])
    return out


def turns(consumers: list[str]) -> int:
    return sum(a != b for a, b in zip(consumers, consumers[1:], strict=False))


def test_runs_give_every_consumer_and_channel_what_one_at_a_time_gives(tmp_path: Path) -> None:
    results = []
    for one_at_a_time in (True, False):
        async def body(m: Model, one_at_a_time: bool = one_at_a_time) -> None:
            results.append(scenario(m, one_at_a_time))
        run(body, tmp_path / str(one_at_a_time))
    (reference, reference_unacked, reference_ready), (runs, unacked, ready) = results
    # Every consumer gets the same messages in the same order, and each channel its tags in order; on
    # the channel two consumers share, a round's runs give each one's share at once, not in turns.
    assert by_consumer(runs) == by_consumer(reference)
    assert runs.keys() == reference.keys() and all(runs[name] == reference[name] for name in ("a", "b", "e"))
    assert unacked == reference_unacked and ready == reference_ready
    # the scenario reaches what it is about: windows full, a backlog left, every consumer served
    assert reference_unacked == {"one": 1, "three": 3, "c": 8, "d": 5, "noack": 0} and reference_ready > 0
    assert all(reference.values())
    # the two consumers of one channel took turns on it: their deliveries interleave there
    sharing = [consumer for _tag, consumer, _body in reference["cd"]]
    assert any(a != b for a, b in zip(sharing, sharing[1:], strict=False)) and {"c", "d"} == set(sharing)
    in_runs = [consumer for _tag, consumer, _body in runs["cd"]]
    assert turns(in_runs) < turns(sharing)
    first_round = [entry[1] for channel in ("a", "b", "cd", "e") for entry in reference[channel][:1]]
    assert first_round == ["one", "three", "c", "noack"]


def test_a_published_run_goes_round_robin_in_one_delivery_call_per_consumer(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        queue = m.declare("work")
        channels = [RecordingChannel(f"ch{i}", 1 << 30) for i in range(4)]
        for i, channel in enumerate(channels):
            queue.add_consumer(Consumer(f"c{i}", queue, channel, prefetch=100))  # type: ignore[arg-type]
        bodies = [b"m%d" % i for i in range(20)]
        assert m.vhost.publish_run(m.vhost.default_exchange, "work", b"\x00\x00", bodies) == (1, False)
        for i, channel in enumerate(channels):
            assert [body for _tag, _consumer, body in channel.delivered] == bodies[i::4]
            assert [tag for tag, _consumer, _body in channel.delivered] == [1, 2, 3, 4, 5]
            assert channel.runs == 1  # the consumer's share of the run in one call
        assert queue.message_count == 0 and queue.unacked_count == 20
    run(body, tmp_path)


def test_a_go_of_several_consumers_takes_runs_unless_a_channel_wide_prefetch_exists(tmp_path: Path) -> None:
    """A go (``Queue.deliver``) hands several consumers' shares out as runs: DELIVERY_BATCH * RUN_SHARE
    messages a go. While the vhost counts a channel-wide prefetch each pick must see its channel's window,
    and a go stays at DELIVERY_BATCH."""
    async def body(m: Model) -> None:
        queue = m.declare("work")
        total = DELIVERY_BATCH * RUN_SHARE * 2
        channels = [RecordingChannel(f"ch{i}", 1 << 30) for i in range(2)]
        consumers = [Consumer(f"c{i}", queue, channel, prefetch=total)  # type: ignore[arg-type]
                     for i, channel in enumerate(channels)]
        bodies = [b"m%d" % i for i in range(total)]
        assert m.vhost.publish_run(m.vhost.default_exchange, "work", b"\x00\x00", bodies) == (1, False)
        for consumer in consumers:
            queue.add_consumer(consumer)

        def delivered() -> int:
            return sum(len(channel.delivered) for channel in channels)

        assert queue.deliver() is True and delivered() == DELIVERY_BATCH * RUN_SHARE
        assert all(channel.runs == 1 for channel in channels)  # each one's share of the go in one call
        m.vhost.channel_wide_prefetches += 1
        assert queue.deliver() is True and delivered() == DELIVERY_BATCH * RUN_SHARE + DELIVERY_BATCH
        m.vhost.channel_wide_prefetches -= 1
        while queue.deliver():
            pass
        assert delivered() == total and queue.message_count == 0
        for i, channel in enumerate(channels):  # round robin over the whole backlog, in order
            assert [body for _tag, _consumer, body in channel.delivered] == bodies[i::2]
    run(body, tmp_path)
