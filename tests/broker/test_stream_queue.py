"""StreamQueue driven without sockets: a real VhostStore in tmp_path, a recording stand-in for the channel."""

from __future__ import annotations

import datetime
import os
from array import array
from pathlib import Path
from typing import Any

import pytest
from pamqp import commands

from lavinpy.broker.errors import NOT_IMPLEMENTED, PRECONDITION_FAILED, BrokerChannelError, BrokerConnectionError
from lavinpy.broker.metrics.stats import AMQP_091, NodeCounters
from lavinpy.broker.ops.deliveries import Deliveries
from lavinpy.broker.queues.base import DELIVERY_BATCH, RUN_SHARE, QueueHost, QueueKind
from lavinpy.broker.queues.consumer import Consumer
from lavinpy.broker.queues.stream import StreamQueue, with_stream_offset
from lavinpy.broker.queues.stream_arguments import validate_stream_consumer, validate_stream_declare
from lavinpy.broker.settings.arguments import parse_max_age
from lavinpy.store.index_kinds import STREAM
from lavinpy.store.record import StoredMessage
from lavinpy.store.segment import segment_name
from lavinpy.store.vhost_store import VhostStore
from lavinpy.wire.properties import decode_properties, encode_properties

SEGMENT_SIZE = 4096
BODY = 400


class LedgerHost:
    """What a channel's books (``Deliveries``) need of their vhost: node counters and rescheduling."""

    def __init__(self) -> None:
        self.node_counters = NodeCounters()

    def schedule_delivery(self, queue: QueueKind) -> None:
        pass  # the tests pump the queue themselves


class RecordingChannel:
    """The channel side of a consumer (can_deliver / deliver / consumer_cancelled), recording deliveries
    and keeping its books with the model's own ledger, as a real channel does."""

    def __init__(self) -> None:
        host = LedgerHost()
        self.books = Deliveries(host, lambda: None, host.node_counters.of(AMQP_091))  # type: ignore[arg-type]
        self.deliveries: list[tuple[str, int, StoredMessage, bool]] = []
        self.cancelled: list[str] = []
        self.runs: list[int] = []  # the length of each deliver_run
        self.writable = True

    def can_deliver(self) -> bool:
        return self.writable

    def deliver(self, consumer: Consumer, pos: int, msg: StoredMessage, redelivered: bool) -> None:
        self.books.deliver(consumer, pos, redelivered)
        self.deliveries.append((consumer.tag, pos, msg, redelivered))

    def deliver_run(self, consumer: Consumer, positions: list[int], messages: list[StoredMessage],
                    redelivered: list[bool] | None) -> None:
        self.runs.append(len(positions))
        self.books.deliver_run(consumer, positions, redelivered)
        for i, (pos, msg) in enumerate(zip(positions, messages, strict=True)):
            self.deliveries.append((consumer.tag, pos, msg, False if redelivered is None else redelivered[i]))

    def delivery_room(self) -> int:
        return 1 << 30

    def consumer_cancelled(self, consumer: Consumer) -> None:
        self.cancelled.append(consumer.tag)

    def settle(self, consumer: Consumer, n: int, queue: StreamQueue, requeue: bool = False) -> None:
        """basic.ack (or nack with requeue) of the ``n`` oldest unacked deliveries, through the books."""
        last = list(self.books.unacked)[n - 1]
        self.books.settle(self.books.take(last, multiple=True), True if requeue else None)


class StandInHost:
    """The host a queue needs (``QueueHost``), and nothing of a real vhost: its name, store and counters,
    recorded delivery scheduling, dead-lettering and deletion."""

    def __init__(self, store: VhostStore) -> None:
        self.name = "/"
        self.store = store
        self.node_counters = NodeCounters()
        self.corrupt_messages = 0
        self.channel_wide_prefetches = 0
        self.scheduled: set[QueueKind] = set()
        self.dead_lettered: list[tuple[str, StoredMessage, str]] = []
        self.deleted: list[str] = []

    def schedule_delivery(self, queue: QueueKind) -> None:
        self.scheduled.add(queue)

    def dead_letter(self, queue: QueueKind, msg: StoredMessage, reason: str) -> int:
        self.dead_lettered.append((queue.name, msg, reason))
        return 0

    def delete_queue(self, name: str) -> int:
        self.deleted.append(name)
        return 0


def open_stream(path: Path, arguments: dict | None = None) -> tuple[VhostStore, StreamQueue]:
    store = VhostStore(path, segment_size=SEGMENT_SIZE)
    store.open()
    index = store.open_queue("s", True, STREAM)
    store.finish_recovery()
    args = {"x-queue-type": "stream", **(arguments or {})}
    host: QueueHost = StandInHost(store)
    return store, StreamQueue(host, "s", index, arguments=args)


def props(headers: dict | None = None) -> bytes:
    return encode_properties(commands.Basic.Properties(content_type="text/plain", headers=headers,
                                                       delivery_mode=2))


def publish(queue: StreamQueue, n: int, start: int = 0, ts: int | None = None, with_message: bool = True,
            headers: dict | None = None) -> None:
    messages = queue.vhost.store.messages
    for i in range(start, start + n):
        data = i.to_bytes(4, "big") * (BODY // 4)
        p = props(headers)
        pos = messages.append("ex", "rk", p, data, ts)
        stored = StoredMessage(messages.read(pos).timestamp, "ex", "rk", p, data)
        queue.push(pos, True, stored if with_message else None)


def number(msg: StoredMessage) -> int:
    return int.from_bytes(msg.body[:4], "big")


def offset_header(msg: StoredMessage) -> int:
    return decode_properties(msg.properties).headers["x-stream-offset"]


def consume(queue: StreamQueue, offset: Any = None, prefetch: int = 1000,
            tag: str = "c") -> tuple[Consumer, RecordingChannel]:
    channel = RecordingChannel()
    args = {} if offset is None else {"x-stream-offset": offset}
    queue.validate_consumer(False, prefetch, args)
    consumer = Consumer(tag, queue, channel, prefetch=prefetch, arguments=args)  # type: ignore[arg-type]
    queue.add_consumer(consumer)
    pump(queue)
    return consumer, channel


def pump(queue: StreamQueue) -> None:
    while queue.deliver():
        pass


def received(channel: RecordingChannel) -> list[tuple[int, int]]:
    """(message number, x-stream-offset header) of each delivery."""
    return [(number(m), offset_header(m)) for _t, _p, m, _r in channel.deliveries]


@pytest.fixture
def stream(tmp_path: Path):
    store, queue = open_stream(tmp_path)
    yield queue
    store.close()


def test_offsets_start_at_one_and_every_delivery_carries_its_offset(stream: StreamQueue) -> None:
    publish(stream, 5)
    consumer, channel = consume(stream, "first")
    assert received(channel) == [(i, i + 1) for i in range(5)]
    assert all(not redelivered for *_, redelivered in channel.deliveries)
    raw = channel.deliveries[0][2].properties
    assert b"\x0fx-stream-offsetl" + (1).to_bytes(8, "big") in raw  # a signed 64-bit long, as RabbitMQ
    decoded = decode_properties(raw)
    assert decoded.content_type == "text/plain" and decoded.delivery_mode == 2
    assert stream.message_count == 5 and consumer.unacked == 5


def test_start_first_last_next_and_numeric(stream: StreamQueue) -> None:
    publish(stream, 10)
    _, first = consume(stream, "first", tag="first")
    _, last = consume(stream, "last", tag="last")
    _, nxt = consume(stream, "next", tag="next")
    _, default = consume(stream, None, tag="default")
    _, numeric = consume(stream, 7, tag="numeric")
    _, below = consume(stream, 0, tag="below")
    _, beyond = consume(stream, 1000, tag="beyond")
    assert [o for _, o in received(first)] == list(range(1, 11))
    assert received(last) == [(9, 10)]
    assert received(nxt) == [] and received(default) == [] and received(beyond) == []
    assert [o for _, o in received(numeric)] == [7, 8, 9, 10]
    assert [o for _, o in received(below)] == list(range(1, 11))
    publish(stream, 2, start=10)
    pump(stream)
    assert received(nxt) == [(10, 11), (11, 12)] == received(default) == received(beyond)
    assert received(last)[-2:] == [(10, 11), (11, 12)]


def test_negative_offsets_count_back_from_the_end(stream: StreamQueue) -> None:
    publish(stream, 10)
    _, last_three = consume(stream, -3, tag="last-three")
    _, last_one = consume(stream, -1, tag="last-one")
    _, all_of_it = consume(stream, -1000, tag="all")
    assert [o for _, o in received(last_three)] == [8, 9, 10]
    assert received(last_one) == [(9, 10)]
    assert [o for _, o in received(all_of_it)] == list(range(1, 11))


def test_start_by_timestamp_and_interval(stream: StreamQueue) -> None:
    base = 1_700_000_000_000
    publish(stream, 3, ts=base)
    publish(stream, 3, start=3, ts=base + 60_000)
    at = datetime.datetime.fromtimestamp((base + 30_000) / 1000, tz=datetime.UTC)
    _, by_time = consume(stream, at, tag="t")
    assert [o for _, o in received(by_time)] == [4, 5, 6]
    # an interval means "that long ago"; these records are far in the past, an hour catches none
    _, interval = consume(stream, "1h", tag="i")
    assert received(interval) == []
    assert stream.start_offset({"x-stream-offset": "1h"}, now_ms=base + 90_000) == 1
    assert stream.start_offset({"x-stream-offset": "45s"}, now_ms=base + 90_000) == 4
    assert stream.start_offset({"x-stream-offset": "10s"}, now_ms=base + 30_000) == 4
    assert stream.start_offset({"x-stream-offset": "1m"}, now_ms=base + 30_000) == 1


def test_prefetch_is_respected_and_acks_are_only_credit(stream: StreamQueue) -> None:
    publish(stream, 10)
    consumer, channel = consume(stream, "first", prefetch=3)
    assert [o for _, o in received(channel)] == [1, 2, 3]
    pump(stream)
    assert len(channel.deliveries) == 3
    channel.settle(consumer, 2, stream)
    pump(stream)
    assert [o for _, o in received(channel)] == [1, 2, 3, 4, 5]
    assert stream.message_count == 10  # nothing removed by acks
    # nack/reject with requeue is credit too: nothing is delivered twice
    channel.deliveries = channel.deliveries[2:]
    channel.settle(consumer, 3, stream, requeue=True)
    pump(stream)
    assert [o for _, o in received(channel)] == [3, 4, 5, 6, 7, 8]
    _, again = consume(stream, "first", tag="again")
    assert [o for _, o in received(again)] == list(range(1, 11))


def test_caught_up_consumer_gets_new_messages_directly_or_through_delivery(stream: StreamQueue) -> None:
    consumer, channel = consume(stream, "next", prefetch=2)
    publish(stream, 1)  # with the message in hand: delivered at once
    assert received(channel) == [(0, 1)]
    publish(stream, 3, start=1, with_message=False)  # read back by deliver()
    assert stream in stream.vhost.scheduled
    pump(stream)
    assert received(channel) == [(0, 1), (1, 2)]  # prefetch 2
    channel.settle(consumer, 2, stream)
    pump(stream)
    assert received(channel)[2:] == [(2, 3), (3, 4)]


def test_existing_headers_keep_their_types_and_a_published_offset_is_replaced() -> None:
    raw = props({"a": 1, "b": "x", "x-stream-offset": 99})
    out = with_stream_offset(raw, 1 << 40)
    headers = decode_properties(out).headers
    assert headers == {"a": 1, "b": "x", "x-stream-offset": 1 << 40}
    assert out.count(b"x-stream-offset") == 1
    bare = with_stream_offset(b"\x00\x00", 5)
    assert decode_properties(bare).headers == {"x-stream-offset": 5}
    typed = bytes.fromhex("2000") + (11).to_bytes(4, "big") + b"\x01kl" + (7).to_bytes(8, "big")  # k: a long
    assert with_stream_offset(typed, 2)[6:17] == b"\x01kl" + (7).to_bytes(8, "big")  # still a long (pamqp: 'b')


def test_restart_returns_the_same_messages_for_old_offsets(tmp_path: Path) -> None:
    store, queue = open_stream(tmp_path)
    publish(queue, 30)
    _, before = consume(queue, 12, tag="a")
    store.close(clean=False)
    store, queue = open_stream(tmp_path)
    assert queue.message_count == 30
    _, after = consume(queue, 12, tag="b")
    assert received(after) == received(before) == [(i - 1, i) for i in range(12, 31)]
    publish(queue, 1, start=30)
    pump(queue)
    assert received(after)[-1] == (30, 31)
    store.close()


def test_retention_by_bytes_on_push_deletes_head_segments(tmp_path: Path) -> None:
    store, queue = open_stream(tmp_path, {"x-max-length-bytes": 3 * SEGMENT_SIZE})
    _, early = consume(queue, "first", tag="early", prefetch=1)  # stuck at offset 1 (no acks)
    publish(queue, 80)
    index = queue.index
    assert index.first_offset > 1 and index.next_offset == 81
    assert index.byte_size <= 3 * SEGMENT_SIZE
    store.messages.settle_removals()  # head segments are unlinked by a worker thread
    files = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("msgs."))
    assert segment_name(1) not in files and len(files) <= 5
    _, late = consume(queue, "first", tag="late")
    assert received(late)[0] == (index.first_offset - 1, index.first_offset)
    assert received(late)[-1] == (79, 80)
    # a consumer left behind by retention continues at the new head
    early_consumer = queue.consumers[0]
    early.settle(early_consumer, 1, queue)
    pump(queue)
    assert received(early)[1][1] == index.first_offset
    store.close()
    store, queue = open_stream(tmp_path, {"x-max-length-bytes": 3 * SEGMENT_SIZE})
    assert queue.index.first_offset == index.first_offset and queue.message_count == 81 - index.first_offset
    store.close()


def test_retention_by_age(tmp_path: Path) -> None:
    store, queue = open_stream(tmp_path, {"x-max-age": "1h"})
    now = 1_800_000_000_000
    publish(queue, 40, ts=now - 2 * 3_600_000)  # two hours old
    publish(queue, 10, start=40, ts=now)
    assert queue.apply_retention(now_ms=now) > 0
    first = queue.index.first_offset
    assert 1 < first <= 41
    _, c = consume(queue, "first")
    assert received(c)[-1] == (49, 50) and received(c)[0][1] == first
    store.close()


def test_get_purge_and_consumer_validation_follow_rabbitmq(stream: StreamQueue) -> None:
    with pytest.raises(BrokerConnectionError) as e:
        stream.get()
    assert e.value.kind is NOT_IMPLEMENTED and "basic.get not supported by stream queues" in e.value.text
    with pytest.raises(BrokerConnectionError) as e:
        stream.purge()
    assert e.value.kind is NOT_IMPLEMENTED and (e.value.class_id, e.value.method_id) == (50, 30)
    with pytest.raises(BrokerChannelError) as e:
        validate_stream_consumer(False, 0, {}, queue="s")
    assert e.value.kind is PRECONDITION_FAILED and "prefetch count is not set" in e.value.text
    with pytest.raises(BrokerConnectionError) as e:
        validate_stream_consumer(True, 10, {}, queue="s")
    assert e.value.kind is NOT_IMPLEMENTED and "automatic acknowledgement" in e.value.text
    with pytest.raises(BrokerConnectionError) as e:
        validate_stream_consumer(False, 10, {}, queue="s", global_prefetch=5)
    assert e.value.kind is NOT_IMPLEMENTED and "global qos" in e.value.text
    bad_arguments = [("x-stream-offset", bad) for bad in ("sometime", 1.5, True, "0h")] + [
        ("x-stream-filter", 5), ("x-stream-filter", [["nested"]]), ("x-filter-match-type", "some"),
        ("x-stream-match-unfiltered", "yes"), ("x-stream-automatic-offset-tracking", 1)]
    for name, bad in bad_arguments:
        with pytest.raises(BrokerChannelError) as e:
            validate_stream_consumer(False, 10, {"x-stream-filter": "a", name: bad}, queue="s")
        assert e.value.kind is PRECONDITION_FAILED and name in e.value.text
    for good in ("first", "last", "next", 0, 5, -5, "7D", datetime.datetime.now(datetime.UTC), b"first"):
        validate_stream_consumer(False, 10, {"x-stream-offset": good}, queue="s")


def test_declare_validation() -> None:
    ok = {"x-queue-type": "stream", "x-max-length-bytes": 10, "x-max-age": "7D", "x-initial-cluster-size": 3,
          "x-stream-max-segment-size-bytes": 1 << 20, "x-queue-leader-locator": "balanced",
          "x-stream-filter-size-bytes": 16}
    validate_stream_declare("s", "/", durable=True, exclusive=False, auto_delete=False, arguments=ok)
    cases = [
        ({"durable": False}, "non-durable"),
        ({"exclusive": True}, "exclusive-owner"),
        ({"auto_delete": True}, "auto-delete"),
        ({"arguments": {"x-max-length": 5}}, "x-max-length"),
        ({"arguments": {"x-max-age": "7d"}}, "x-max-age"),
        ({"arguments": {"x-max-length-bytes": -1}}, "x-max-length-bytes"),
        ({"arguments": {"x-stream-max-segment-size-bytes": "big"}}, "x-stream-max-segment-size-bytes"),
        ({"arguments": {"x-stream-max-segment-size-bytes": 0}}, "x-stream-max-segment-size-bytes"),
        ({"arguments": {"x-initial-cluster-size": 0}}, "x-initial-cluster-size"),
        ({"arguments": {"x-queue-leader-locator": "nearest"}}, "x-queue-leader-locator"),
        ({"arguments": {"x-stream-filter-size-bytes": 15}}, "x-stream-filter-size-bytes"),
        ({"arguments": {"x-stream-filter-size-bytes": 256}}, "x-stream-filter-size-bytes"),
        ({"arguments": {"x-stream-filter-size-bytes": "32"}}, "x-stream-filter-size-bytes"),
    ]
    for change, word in cases:
        kw: dict[str, Any] = {"durable": True, "exclusive": False, "auto_delete": False, "arguments": ok}
        kw.update({**change, "arguments": {**ok, **change.get("arguments", {})}} if "arguments" in change else change)
        with pytest.raises(BrokerChannelError) as e:
            validate_stream_declare("s", "/", **kw)
        assert e.value.kind is PRECONDITION_FAILED and word in e.value.text
    assert parse_max_age("12h") == 12 * 3_600_000 and parse_max_age("7D") == 7 * 86_400_000


def test_delete_cancels_consumers_and_removes_files(tmp_path: Path) -> None:
    store, queue = open_stream(tmp_path)
    publish(queue, 30)
    _, channel = consume(queue, "first")
    directory = queue.index.directory
    assert queue.delete() == 30
    assert channel.cancelled == ["c"] and queue.consumers == [] and queue.deleted
    assert not directory.exists()
    store.messages.settle_removals()
    remaining = [p for p in os.listdir(tmp_path) if p.startswith("msgs.")]
    assert remaining == [segment_name(store.messages.current_segment_id)]
    store.close()


def test_remove_consumer_and_damaged_record_is_skipped(stream: StreamQueue) -> None:
    publish(stream, 3)
    consumer, channel = consume(stream, "next")
    stream.remove_consumer(consumer)
    assert stream.consumers == [] and stream.offset_of(consumer) is None and channel.cancelled == []
    stream.index.append(stream.index.get(3) + (1 << 40))  # offset 4 points past the valid data
    publish(stream, 1, start=10)  # offset 5
    _, other = consume(stream, 4, tag="other")
    # The damaged record is reported and skipped; the stream goes on with the next offset.
    assert other.cancelled == [] and [number(m) for _, _, m, _ in other.deliveries] == [10]
    assert stream.corrupt_messages == 1 and stream.vhost.corrupt_messages == 1


def test_stored_messages_go_out_in_runs_within_credit_and_around_damage(stream: StreamQueue) -> None:
    publish(stream, 30, with_message=False)  # stored only: every delivery comes from deliver()
    good = stream.index.get(31 - 1)
    stream.index.append(good + (1 << 40))  # offset 31: past the valid data (damaged)
    publish(stream, 10, start=100, with_message=False)  # offsets 32..41
    consumer, channel = consume(stream, "first", prefetch=25)
    # Credit bounds a run: 25 of 30, in far fewer deliver calls than messages.
    assert received(channel) == [(i, i + 1) for i in range(25)]
    assert consumer.unacked == 25 and sum(channel.runs) == 25 and len(channel.runs) < 25
    channel.settle(consumer, 25, stream)
    pump(stream)
    # The rest of the run, the damaged offset skipped (reported once), then the next run goes on.
    assert received(channel)[25:] == [(i, i + 1) for i in range(25, 30)] + [(100 + i, 32 + i) for i in range(10)]
    assert stream.corrupt_messages == 1 and consumer.unacked == 15
    assert stream.offset_of(consumer) == 42


def test_a_go_takes_more_deliveries_in_runs_than_one_at_a_time(stream: StreamQueue) -> None:
    """A delivery in a run costs a go a RUN_SHARE-th of one delivered alone (a filtering consumer's):
    one go (``deliver``) hands a consumer's runs DELIVERY_BATCH * RUN_SHARE messages, a filtering
    consumer DELIVERY_BATCH at most; both then say more could go out, and the next goes go on in order."""
    total = DELIVERY_BATCH * RUN_SHARE + 100
    publish(stream, total, with_message=False, headers={"x-stream-filter-value": "a"})
    channel = RecordingChannel()
    args = {"x-stream-offset": "first"}
    plain = Consumer("plain", stream, channel, prefetch=total, arguments=args)  # type: ignore[arg-type]
    stream.add_consumer(plain)
    assert stream.deliver() is True
    assert len(channel.deliveries) == DELIVERY_BATCH * RUN_SHARE and len(channel.runs) < 20
    pump(stream)
    assert received(channel) == [(i, i + 1) for i in range(total)]
    stream.remove_consumer(plain)

    filtered_channel = RecordingChannel()
    filtered_args = {"x-stream-offset": "first", "x-stream-filter": "a"}
    filtered = Consumer("filtered", stream, filtered_channel, prefetch=total,  # type: ignore[arg-type]
                        arguments=filtered_args)
    stream.add_consumer(filtered)
    assert stream.deliver() is True
    assert 0 < len(filtered_channel.deliveries) <= DELIVERY_BATCH
    pump(stream)
    assert received(filtered_channel) == [(i, i + 1) for i in range(total)]


def test_stream_index_get_many_matches_get(stream: StreamQueue) -> None:
    publish(stream, 40, with_message=False)
    index = stream.index
    assert index.get_many(1, 40) == [index.get(o) for o in range(1, 41)]
    assert index.get_many(35, 100) == [index.get(o) for o in range(35, 41)]
    assert index.get_many(41, 5) == [] and index.get_many(0, 5) == []
    index.append_many([index.get(40)] * 5000)  # past the first 4096-entry chunk of the in-memory log
    assert index.get_many(4000, 300) == [index.get(o) for o in range(4000, 4300)]


def test_stamped_runs_match_one_by_one_stamping_compiled_and_pure() -> None:
    from lavinpy.broker.queues import stream_stamps as stream_queue
    from lavinpy.wire import accel

    blocks = [props(), props({"a": 1, "x-stream-offset": "theirs"}), b"\x00\x00", props({"n": {"deep": [1, 2]}})]
    messages = [StoredMessage(i, "ex", f"rk{i % 3}", blocks[(i // 2) % len(blocks)], b"body%d" % i)
                for i in range(40)]
    for first in (1, 2**62, -5):
        expected = [m._replace(properties=with_stream_offset(m.properties, first + i)) for i, m in enumerate(messages)]
        stream_queue._SPLICES.clear()  # every block's first message takes the general way
        run = stream_queue.stamped_run(messages, first)
        assert run == expected and all(type(m) is StoredMessage for m in run)
        assert [offset_header(m) for m in run] == [first + i for i in range(40)]
    # the compiled twin (when built) stops where the pure one does, with the same messages
    cstream = accel.load("lavinpy.wire._cstream")
    splices = {blocks[0]: stream_queue._SPLICES[blocks[0]]}
    pure = stream_queue._stamp_offsets(messages, 0, 7, splices)
    assert pure[1] == 2 and pure[0] == expected_first_two(messages, 7)
    if cstream is not None:
        assert cstream.stamp_offsets(messages, 0, 7, splices, StoredMessage) == pure
        assert cstream.stamp_offsets(messages, 8, 7, splices, StoredMessage) == \
            stream_queue._stamp_offsets(messages, 8, 7, splices)


def expected_first_two(messages: list[StoredMessage], first: int) -> list[StoredMessage]:
    return [m._replace(properties=with_stream_offset(m.properties, first + i)) for i, m in enumerate(messages[:2])]


def test_published_run_goes_to_a_caught_up_consumer_as_one_run_within_credit(stream: StreamQueue) -> None:
    from lavinpy.broker.queues.publish_run import PublishRun

    publish(stream, 2)
    consumer, channel = consume(stream, "next", prefetch=10)
    p = props({"h": "v"})
    bodies = [i.to_bytes(4, "big") * 4 for i in range(50, 75)]
    messages = stream.vhost.store.messages
    positions = array("Q", [messages.append("ex", "rk", p, body, 1000) for body in bodies])
    stream.push_many(positions, True, PublishRun("ex", "rk", p, bodies, 1000), 0)
    # in hand, as far as the prefetch allows: one run of 10, offsets 3..12 stamped in order
    assert channel.runs == [10] and received(channel) == [(50 + i, 3 + i) for i in range(10)]
    assert [pos for _t, pos, _m, _r in channel.deliveries] == list(positions[:10])
    assert decode_properties(channel.deliveries[0][2].properties).headers == {"h": "v", "x-stream-offset": 3}
    assert stream in stream.vhost.scheduled  # the rest waits for credit
    channel.settle(consumer, 10, stream)
    pump(stream)
    assert received(channel)[10:] == [(60 + i, 13 + i) for i in range(10)] and consumer.unacked == 10
