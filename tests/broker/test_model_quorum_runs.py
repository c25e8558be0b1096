"""A quorum queue (strict priorities 0-31, a delivery limit) takes published runs, delivery runs and
multiple acks as runs where no feature needs a step per message, and gives exactly what one message at a
time gives: each consumer's deliveries (order, redelivered flag, delivery-count header), the messages
dead-lettered past the delivery limit, and the queue after a restart.

The reference is the same model with the queue's run paths turned off (``takes_runs``), publishing one
message at a time and acking each delivery on its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lavinpy.broker.ops import messages as operations_messages
from lavinpy.broker.queues.consumer import Consumer
from lavinpy.store.record import StoredMessage
from lavinpy.wire.properties import peek_headers
from tests.broker.model_harness import Model, run

Delivery = tuple[str, bytes, bool, Any]  # consumer tag, body, redelivered, x-delivery-count


class RecordingChannel:
    """A channel as a queue delivers to it, keeping each delivery's position for its settlement."""

    def __init__(self) -> None:
        self.delivered: list[Delivery] = []
        self.positions: list[int] = []
        self.runs = 0

    def can_deliver(self) -> bool:
        return True

    def delivery_room(self) -> int:
        return 1 << 30

    def deliver(self, consumer: Any, pos: int, msg: StoredMessage, redelivered: bool) -> None:
        self.deliver_run(consumer, [pos], [msg], [redelivered])

    def deliver_run(self, consumer: Any, positions: list[int], messages: list[StoredMessage],
                    redelivered: list[bool] | None) -> None:
        for i, msg in enumerate(messages):
            headers = peek_headers(msg.properties) or {}
            self.delivered.append((consumer.tag, bytes(msg.body), bool(redelivered and redelivered[i]),
                                   headers.get("x-delivery-count")))
        self.positions.extend(positions)
        self.runs += 1

    def consumer_cancelled(self, consumer: Any) -> None:
        raise AssertionError("not cancelled in these tests")


def props(**properties: Any) -> bytes:
    return operations_messages.properties_from_json(properties)


def scenario(m: Model, by_runs: bool) -> tuple[Any, ...]:
    vhost = m.vhost
    m.dead_letter_target()
    queue = m.declare("work", durable=True, queue_type="quorum", delivery_limit=2, dead_letter_exchange="dlx")
    assert queue.kind == "quorum" and queue.special
    if not by_runs:
        queue.features.takes_runs = False  # type: ignore[attr-defined]
    exchange = vhost.default_exchange
    serial = 0

    def publish(properties: bytes | list[bytes], count: int) -> None:
        nonlocal serial
        bodies = [b"m%d" % (serial + i) for i in range(count)]
        serial += count
        if by_runs:
            assert vhost.publish_run(exchange, "work", properties, bodies) == (1, True)
        else:
            for i, body in enumerate(bodies):
                vhost.publish(exchange, "work", properties[i] if isinstance(properties, list) else properties, body)

    def settle(channel: RecordingChannel, consumer: Consumer, count: int) -> None:
        """The consumer's oldest ``count`` unsettled deliveries acked (a multiple ack)."""
        positions = channel.positions[:count]
        del channel.positions[:count]
        if by_runs:
            queue.ack_many(positions)
        else:
            for pos in positions:
                queue.ack(pos)
        consumer.credit(len(positions))

    def deliver() -> None:
        while queue.deliver():
            pass

    persistent = props(delivery_mode=2)
    publish(persistent, 30)  # no priority: level 4
    publish(props(delivery_mode=2, priority=9), 10)
    publish(props(delivery_mode=2, priority=40), 5)  # above 31: level 31
    publish([props(delivery_mode=2, priority=2, message_id=f"id{i}") for i in range(6)], 6)  # one level
    publish([props(delivery_mode=2, priority=i % 3) for i in range(9)], 9)  # levels differ: one by one
    channels = [RecordingChannel(), RecordingChannel()]
    consumers = [Consumer("a", queue, channels[0], prefetch=7),  # type: ignore[arg-type]
                 Consumer("b", queue, channels[1], prefetch=11)]  # type: ignore[arg-type]
    for consumer in consumers:
        queue.add_consumer(consumer)
    deliver()
    settle(channels[0], consumers[0], 5)
    settle(channels[1], consumers[1], 11)
    deliver()
    # two deliveries come back (counted, redelivered with a delivery count), one of them three times:
    # past the limit of 2 it is dead-lettered
    back = channels[0].positions.pop(0)
    for _ in range(3):
        queue.requeue(back)
        consumers[0].credit(1)
        deliver()
        if back in channels[0].positions:
            channels[0].positions.remove(back)
        elif back in channels[1].positions:
            channels[1].positions.remove(back)
            consumers[1].credit(1)
            consumers[0].unacked += 1
    queue.requeue(channels[1].positions.pop(0))
    consumers[1].credit(1)
    deliver()
    for channel, consumer in zip(channels, consumers, strict=True):
        settle(channel, consumer, len(channel.positions))
    deliver()
    settle(channels[0], consumers[0], 3)
    publish(props(delivery_mode=2, priority=31), 4)  # consumers waiting: some taken in hand
    deliver()
    delivered = [channel.delivered for channel in channels]
    state = (queue.message_count, queue.unacked_count, m.count("dead"))
    dead = m.bodies("dead")
    for consumer in consumers:
        queue.remove_consumer(consumer)  # their unsettled deliveries stay unacked until the restart
    m.reopen()
    after = m.bodies("work")
    return delivered, state, after, dead


def test_a_quorum_queue_by_runs_gives_what_one_message_at_a_time_gives(tmp_path: Path) -> None:
    results = []
    for by_runs in (False, True):
        async def body(m: Model, by_runs: bool = by_runs) -> None:
            results.append(scenario(m, by_runs))
        run(body, tmp_path / str(by_runs))
    reference, runs = results
    assert runs == reference
    delivered, (ready, unacked, dead_count), after, dead = reference
    # the scenario reaches what it is about: priorities first, redeliveries counted, one dead-lettered
    first = [body for channel in delivered for _tag, body, _again, _count in channel[:3]]
    assert first[:3] == [b"m40", b"m42", b"m44"] and first[3:] == [b"m41", b"m43", b"m30"]  # level 31, then 9
    assert any(again and count == 1 for channel in delivered for _tag, _body, again, count in channel)
    assert dead_count == 1 and len(dead) == 1 and ready > 0 and unacked > 0
    assert len(after) == ready + unacked


def test_a_published_run_of_one_level_enters_a_quorum_queue_whole(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        queue = m.declare("work", durable=True, queue_type="quorum")
        channel = RecordingChannel()
        consumer = Consumer("a", queue, channel, prefetch=100)  # type: ignore[arg-type]
        queue.add_consumer(consumer)
        bodies = [b"m%d" % i for i in range(50)]
        assert m.vhost.publish_run(m.vhost.default_exchange, "work", props(delivery_mode=2), bodies) == (1, True)
        assert channel.runs == 1 and [b for _t, b, _r, _c in channel.delivered] == bodies
        queue.ack_many(channel.positions)
        assert queue.unacked_count == 0 and queue.message_count == 0
    run(body, tmp_path)
