"""A channel's deliveries as the model books them (broker.ops.deliveries), in process, without a session:
counts on the queue and in the session's protocol's counters, credit back to the consumer,
rescheduling, and the order of requeues."""

from __future__ import annotations

from typing import Any

import pytest

from lavinpy.broker.errors import PRECONDITION_FAILED, BrokerChannelError
from lavinpy.broker.metrics.stats import MessageCounters, NodeCounters, ProtocolCounters, ProtocolId
from lavinpy.broker.ops.deliveries import Deliveries
from lavinpy.broker.ops.unacked_book import OWNED_RUN_MAX
from lavinpy.broker.queues.consumer import Consumer


class BookQueue:
    """The queue side the ledger uses: settling calls, counters, consumers and ready messages."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.stats = MessageCounters()
        self.consumers: list[Any] = []
        self.message_count = 0
        self.calls: list[tuple[str, Any]] = []
        self.ready: list[tuple[int, bytes, bool]] = []

    def ack(self, pos: int) -> None:
        self.calls.append(("ack", pos))

    def ack_many(self, positions: list[int]) -> None:
        self.calls.append(("ack_many", positions))

    def requeue_many(self, positions: list[int]) -> None:
        self.calls.append(("requeue_many", list(positions)))
        self.message_count += len(positions)

    def reject(self, pos: int) -> None:
        self.calls.append(("reject", pos))

    def get(self) -> Any:
        return self.ready.pop(0) if self.ready else None


class BookVhost:
    def __init__(self) -> None:
        self.node_counters = NodeCounters()
        self.scheduled: list[str] = []
        self.channel_wide_prefetches = 0  # (Deliveries.set_prefetch keeps it)

    def schedule_delivery(self, queue: Any) -> None:
        self.scheduled.append(queue.name)


class OpenChannel:
    def can_deliver(self) -> bool:
        return True


FACE = ProtocolId("face", "A Face")


def ledger() -> tuple[Deliveries, BookVhost, list[int]]:
    vhost = BookVhost()
    freed: list[int] = []
    counters = vhost.node_counters.of(FACE)
    return Deliveries(vhost, lambda: freed.append(1), counters), vhost, freed  # type: ignore[arg-type]


def protocol_counts(deliveries: Deliveries) -> dict[str, int]:
    counters: ProtocolCounters = deliveries.counters
    return {name: counters.count(name) for name in ("deliver", "deliver_no_ack", "get", "get_no_ack", "ack",
                                                    "redeliver", "reject") if counters.count(name)}


def consumer_of(queue: BookQueue, tag: str = "c", no_ack: bool = False) -> Consumer:
    consumer = Consumer(tag, queue, OpenChannel(), no_ack=no_ack, prefetch=10)  # type: ignore[arg-type]
    queue.consumers.append(consumer)
    return consumer


def test_a_run_is_counted_on_its_queue_and_acked_as_one_run():
    deliveries, vhost, freed = ledger()
    queue = BookQueue("q")
    consumer = consumer_of(queue)
    consumer.unacked = 3  # the queue counts what it hands out
    first = deliveries.deliver_run(consumer, [10, 11, 12], [False, True, False])
    assert first == 1 and list(deliveries.unacked) == [1, 2, 3]
    assert (queue.stats.deliver, queue.stats.redeliver) == (3, 1)
    queue.message_count = 5
    assert deliveries.ack_run([1, 2, 3]) is None
    assert queue.calls == [("ack_many", [10, 11, 12])] and queue.stats.ack == 3
    assert consumer.unacked == 0 and vhost.scheduled == ["q"] and freed == []
    assert protocol_counts(deliveries) == {"deliver": 3, "redeliver": 1, "ack": 3}
    assert vhost.node_counters.by_protocol["face"] is deliveries.counters


def test_acks_across_queues_and_consumers_are_counted_for_the_protocol_once_each():
    deliveries, _vhost, _freed = ledger()
    first, second = BookQueue("a"), BookQueue("b")
    one, two = consumer_of(first, "one"), consumer_of(second, "two", no_ack=False)
    one.unacked, two.unacked = 2, 1
    deliveries.deliver(one, 1, False)
    deliveries.deliver(two, 2, True)
    deliveries.deliver(one, 3, False)
    assert deliveries.ack_run([1, 2, 3]) is None
    assert (first.stats.ack, second.stats.ack) == (2, 1)
    assert protocol_counts(deliveries) == {"deliver": 3, "redeliver": 1, "ack": 3}


def test_an_unknown_tag_in_an_ack_run_stops_it_there():
    deliveries, _vhost, _freed = ledger()
    queue = BookQueue("q")
    consumer = consumer_of(queue)
    consumer.unacked = 4
    deliveries.deliver_run(consumer, [1, 2, 3, 4], None)
    assert deliveries.ack_run([1, 9, 3]) == 1
    assert queue.calls == [("ack_many", [1])] and queue.stats.ack == 1 and consumer.unacked == 3
    assert list(deliveries.unacked) == [2, 3, 4]  # in delivery order again


def test_nack_requeues_or_rejects_counting_rejects_and_giving_credit_back():
    deliveries, vhost, freed = ledger()
    deliveries.prefetch = 5  # channel-wide: the session is told when room is freed
    queue = BookQueue("q")
    consumer = consumer_of(queue)
    consumer.unacked = 3
    deliveries.deliver_run(consumer, [7, 8, 9], None)
    deliveries.settle(deliveries.take(2, True), False)
    assert queue.calls == [("reject", 7), ("reject", 8)] and queue.stats.reject == 2
    assert protocol_counts(deliveries) == {"deliver": 3, "reject": 2}
    assert consumer.unacked == 1 and freed == [1] and vhost.scheduled == []
    deliveries.settle(deliveries.take(3, False), True)
    assert queue.calls[-1] == ("requeue_many", [9]) and consumer.unacked == 0 and vhost.scheduled == ["q"]
    with pytest.raises(BrokerChannelError) as e:
        deliveries.take(3, False)
    assert e.value.kind is PRECONDITION_FAILED and e.value.text == "PRECONDITION_FAILED - unknown delivery tag 3"


def test_get_counts_and_no_ack_settles_at_once():
    deliveries, _vhost, _freed = ledger()
    queue = BookQueue("q")
    queue.ready = [(4, b"m1", True), (5, b"m2", False)]
    assert deliveries.get(queue, False) == (1, b"m1", True)  # type: ignore[arg-type]
    assert deliveries.get(queue, True) == (2, b"m2", False)  # type: ignore[arg-type]
    assert deliveries.get(queue, False) is None
    assert (queue.stats.get, queue.stats.get_no_ack, queue.stats.redeliver) == (1, 1, 1)
    assert protocol_counts(deliveries) == {"get": 1, "get_no_ack": 1, "redeliver": 1}
    assert list(deliveries.unacked) == [1] and queue.calls == [("ack", 5)]


def test_close_requeues_every_delivery_in_order_and_counts_the_channel():
    deliveries, vhost, _freed = ledger()
    first, second = BookQueue("a"), BookQueue("b")
    one, two = consumer_of(first, "one"), consumer_of(second, "two")
    one.unacked, two.unacked = 1, 2
    deliveries.deliver(one, 30, False)
    deliveries.deliver_run(two, [40, 41], None)
    deliveries.close(confirm_publishes=7)
    # One call a queue, each with its positions in delivery order.
    assert first.calls == [("requeue_many", [30])] and second.calls == [("requeue_many", [40, 41])]
    assert (one.unacked, two.unacked) == (0, 0) and deliveries.unacked == {}
    assert (vhost.node_counters.channels_closed, vhost.node_counters.received_confirm_closed) == (1, 7)


def test_a_multiple_ack_of_long_whole_runs_acks_each_by_its_own_list():
    deliveries, _vhost, _freed = ledger()
    queue = BookQueue("q")
    consumer = consumer_of(queue)
    size = OWNED_RUN_MAX + 100  # longer than a run the book would join to the one before
    runs = [list(range(10_000 * k, 10_000 * k + size)) for k in range(1, 4)]
    consumer.unacked = 3 * size
    for run in runs:
        deliveries.deliver_run(consumer, run, None)
    deliveries.ack_multiple(2 * size + 7)  # two whole runs and the head of the third
    assert [name for name, _positions in queue.calls] == ["ack_many"] * 3
    assert queue.calls[0][1] is runs[0] and queue.calls[1][1] is runs[1]  # the queue's runs, not copies
    assert queue.calls[2][1] == runs[2][:7]
    assert consumer.unacked == size - 7 and queue.stats.ack == 2 * size + 7


def test_multiple_acks_settle_run_slices_as_take_and_settle_would():
    deliveries, vhost, _freed = ledger()
    queue = BookQueue("q")
    consumer = consumer_of(queue)
    consumer.unacked = 5
    deliveries.deliver_run(consumer, [20, 21, 22], None)
    deliveries.deliver(consumer, 23, False)
    deliveries.deliver(consumer, 24, False)
    assert deliveries.ack_run([2]) is None  # out of order: the run keeps its hole
    deliveries.ack_multiple(4)
    assert queue.calls == [("ack", 21), ("ack_many", [20, 22, 23])]
    assert list(deliveries.unacked) == [5] and consumer.unacked == 1 and queue.stats.ack == 4
    with pytest.raises(BrokerChannelError):
        deliveries.ack_multiple(4)  # nothing unacked up to 4: 406, as take() answers
    deliveries.ack_multiple(0)  # everything
    assert list(deliveries.unacked) == [] and queue.calls[-1] == ("ack", 24)
    deliveries.ack_multiple(0)  # nothing left: no error, as take(0, True)
    assert vhost.scheduled == []
