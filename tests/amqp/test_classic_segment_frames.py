"""A classic queue consumer's bytes and the broker's books are the same whichever way its runs were framed:
straight from the segments (compiled, lavinpy/store/_cstore_frames.c through broker/queues/stored_runs.py)
or read and then framed (the general way, which the pure path always takes): requeued messages with their
redelivered flag, consecutive tags, empty, multi-frame and large bodies, two exchanges, a damaged record
reported and skipped, one consumer alone or beside another whose window is full; and a round's reader whose
connection the broker closes mid-read gives back everything it had not acked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pamqp import body, commands, frame
from session_client import Client, Harness

from lavinpy.broker.queues import queue as classic_queue
from lavinpy.broker.queues import stored_runs
from lavinpy.store import stamped_frames as sf
from lavinpy.wire.position import OFFSET_SHIFT, SEGMENT_MASK

PROPERTIES = [commands.Basic.Properties(delivery_mode=2), None,
              commands.Basic.Properties(headers={"a": 1}, content_type="text/plain", delivery_mode=2)]
COUNT = 120
REQUEUED = 10


def body_of(i: int) -> bytes:
    if i % 17 == 16:
        return b""
    if i == 40:
        return b"L" * (300 * 1024)  # a large record (read in place) split over several body frames
    if i == 41:
        return b"F" * 140_000  # larger than a frame
    return b"m%d" % i * (1 + i % 5)


def publish_all(harness: Harness, publisher: Client, kind: str = "classic") -> None:
    publisher.send((1, commands.Queue.Declare(queue="q", durable=True, arguments={"x-queue-type": kind})),
                   (1, commands.Exchange.Declare(exchange="ex.fan", exchange_type="fanout")),
                   (1, commands.Queue.Bind(queue="q", exchange="ex.fan")))
    publisher.read()
    for i in range(COUNT):
        exchange, key = ("ex.fan", f"k{i % 3}") if i % 4 == 3 else ("", "q")
        method, head, whole = publisher.publish(1, key, body_of(i), exchange, PROPERTIES[(i // 5) % 3])
        size = publisher.conn.frame_max - 8  # a body larger than a frame goes in several
        publisher.send(method, head, *((1, body.ContentBody(whole[1].value[at:at + size]))
                                       for at in range(0, len(whole[1].value), size)))
    publisher.read()


def damage(harness: Harness, position: int) -> None:
    """The last body byte of the record at ``position`` changed on disk: it fails its CRC."""
    store = harness.broker.vhosts["/"].store.messages
    segment = store.readable(position & SEGMENT_MASK)[0]  # type: ignore[index]
    offset = position >> OFFSET_SHIFT
    end = offset + 8 + int.from_bytes(segment.mm[offset:offset + 4], "little")
    segment.mm[end - 1] ^= 0xFF


def read_deliveries(tmp_path: Path, damaged: int | None, beside: bool, kind: str = "classic"
                    ) -> tuple[bytes, list[Any], tuple[int, ...]]:
    """The consumer's bytes, its deliveries as (tag, redelivered, body) and the books after them."""
    harness = Harness(tmp_path, fsync="never")
    try:
        publisher, consumer = harness.open_client(), harness.open_client(("127.0.0.1", 40000))
        publish_all(harness, publisher, kind)
        queue = harness.broker.vhosts["/"].queues["q"]
        # the first REQUEUED taken by a consumer that gives them back: delivered again, redelivered
        publisher.send((1, commands.Basic.Qos(prefetch_count=REQUEUED)),
                       (1, commands.Basic.Consume(queue="q", consumer_tag="first")))
        publisher.read()
        publisher.send((1, commands.Basic.Cancel(consumer_tag="first")),
                       (1, commands.Basic.Nack(delivery_tag=REQUEUED, multiple=True, requeue=True)))
        publisher.read()
        if damaged is not None:
            damage(harness, list(queue.index)[damaged])
        if beside:  # a consumer whose window fills first: the reader's runs are a round's one-consumer share
            publisher.send((1, commands.Basic.Qos(prefetch_count=5)),
                           (1, commands.Basic.Consume(queue="q", consumer_tag="beside")))
            publisher.read()
        consumer.send((1, commands.Basic.Qos(prefetch_count=1000)),
                      (1, commands.Basic.Consume(queue="q", consumer_tag="c")))
        harness.run_soon()
        data = b"".join(consumer.conn.data_to_send())
        channel = consumer.conn.channels[1]
        reader = next(iter(channel.consumers.values()))
        books = (queue.message_count, queue.unacked_count, reader.unacked, len(channel.deliveries.unacked),
                 channel.deliveries.tag, queue.stats.deliver, queue.stats.redeliver, queue.corrupt_messages)
        deliveries: list[Any] = []
        for _channel, value in parse(data):
            if isinstance(value, commands.Basic.Deliver):
                deliveries.append([value.delivery_tag, value.redelivered, b""])
            elif isinstance(value, body.ContentBody):
                deliveries[-1][2] += value.value
        consumer.send((1, commands.Basic.Ack(delivery_tag=0, multiple=True)))
        harness.run_soon()
        assert queue.unacked_count == 5 * beside and len(channel.deliveries.unacked) == 0 and reader.unacked == 0
        return data, deliveries, books
    finally:
        harness.close()


def parse(data: bytes) -> list[Any]:
    """The frames in ``data``, (channel, value)."""
    out = []
    while data:
        used, channel, value = frame.unmarshal(data)
        out.append((channel, value))
        data = data[used:]
    return out


@pytest.fixture
def framed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many records each call framed straight from the segments (the store's compiled framing)."""
    counts: list[int] = []
    own = sf.segment_stored_frames

    def counted(*args: Any) -> tuple[bytes, int, int, int]:
        got = own(*args)
        counts.append(got[1])
        return got

    monkeypatch.setattr(stored_runs, "segment_stored_frames", counted)
    return counts


@pytest.mark.parametrize("beside", [False, True])
@pytest.mark.parametrize("damaged", [None, 3, 23])
def test_a_classic_read_s_bytes_and_books_are_the_general_way_s(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 framed: list[int], damaged: int | None,
                                                                 beside: bool) -> None:
    data, deliveries, books = read_deliveries(tmp_path / "segments", damaged, beside)
    assert sum(framed) > 60 if sf.STORED_FRAMES_COMPILED else not framed
    monkeypatch.setattr(classic_queue, "stored_run_of", lambda consumer: None)  # every run read, then framed
    general = read_deliveries(tmp_path / "general", damaged, beside)
    assert data == general[0]
    assert books == general[2]
    # and what the consumer got, said independently of both: consecutive tags, in queue order (the requeued
    # ones back at the head, redelivered), every message published but the damaged one and the five the
    # other consumer took; the books: all of them unacked, the damaged one counted
    left = [i for i in range(COUNT) if i != damaged][5 * beside:]
    assert [tag for tag, _, _ in deliveries] == list(range(1, len(left) + 1))
    assert [b for _, _, b in deliveries] == [body_of(i) for i in left]
    assert [again for _, again, _ in deliveries] == [i < REQUEUED for i in left]
    assert books[:5] == (0, len(left) + 5 * beside, len(left), len(left), len(left))
    assert books[7] == (damaged is not None)


def read_round(tmp_path: Path, damaged: int | None, one_channel: bool, framed: list[int]
               ) -> tuple[list[bytes], tuple[int, ...], int]:
    """Two consumers (prefetch 30 each) start on the queue at once, each on a connection of its own or both
    on one channel: each connection's bytes, the books after the round and after their acks (which let the
    queue fill their windows again), and how many deliveries ``framed`` had counted before those acks."""
    harness = Harness(tmp_path, fsync="never")
    try:
        publisher = harness.connect()
        publisher.handshake()
        publisher.open_channel(1)
        publish_all(harness, publisher)
        queue = harness.broker.vhosts["/"].queues["q"]
        publisher.send((1, commands.Basic.Qos(prefetch_count=REQUEUED)),
                       (1, commands.Basic.Consume(queue="q", consumer_tag="first")))
        publisher.read()
        publisher.send((1, commands.Basic.Cancel(consumer_tag="first")),
                       (1, commands.Basic.Nack(delivery_tag=REQUEUED, multiple=True, requeue=True)))
        publisher.read()
        if damaged is not None:
            damage(harness, list(queue.index)[damaged])
        readers = [harness.connect(("127.0.0.1", 40000 + i)) for i in range(1 if one_channel else 2)]
        for reader in readers:
            reader.handshake()
            reader.open_channel(1)
        for i, tag in enumerate(("x", "y")):
            readers[i % len(readers)].send((1, commands.Basic.Qos(prefetch_count=30)),
                                           (1, commands.Basic.Consume(queue="q", consumer_tag=tag)))
        harness.run_soon()
        out = [b"".join(reader.conn.data_to_send()) for reader in readers]
        books = (queue.message_count, queue.unacked_count, queue.stats.deliver, queue.stats.redeliver,
                 queue.corrupt_messages, *(c.unacked for r in readers for c in r.conn.channels[1].consumers.values()))
        before_acks = sum(framed)
        for reader in readers:  # each share's in-order acks settle it
            reader.send((1, commands.Basic.Ack(delivery_tag=0, multiple=True)))
        harness.run_soon()
        return out, (*books, queue.unacked_count, queue.message_count), before_acks
    finally:
        harness.close()


@pytest.mark.parametrize("one_channel", [False, True])
@pytest.mark.parametrize("damaged", [None, 4])
def test_a_round_of_two_readers_is_the_general_way_s(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     framed: list[int], damaged: int | None,
                                                     one_channel: bool) -> None:
    out, books, before_acks = read_round(tmp_path / "segments", damaged, one_channel, framed)
    # the first consumer's ten from the segments, then most of the round's 60 (on one channel the two
    # consumers' windows fill one after the other: each a one-consumer share)
    if sf.STORED_FRAMES_COMPILED:
        assert before_acks >= 10 + 50
    else:
        assert not framed
    monkeypatch.setattr(classic_queue, "stored_run_of", lambda consumer: None)
    general = read_round(tmp_path / "general", damaged, one_channel, [])
    assert out == general[0]
    assert books == general[1]
    delivered = 60  # both windows full; the damaged one taken out, and one more in its place
    redelivered = REQUEUED - (damaged is not None and damaged < REQUEUED)
    assert books[:7] == (COUNT - delivered - (damaged is not None), delivered, REQUEUED + delivered, redelivered,
                         damaged is not None, 30, 30)
    assert books[7:] == (COUNT - delivered - (damaged is not None), 0)  # the windows filled again with the rest


class FakeChannel:
    deliver_stored_run = staticmethod(lambda *args: (0, 0, 0))


class FakeReader:
    no_ack = False

    def __init__(self, channel: FakeChannel) -> None:
        self.channel = channel


class RecordedRound:
    """A queue for ``stored_runs.deliver_stored_round`` whose index records its splits, with
    ``deliver_stored``'s calls recorded as (consumer, share, flags)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.splits: list[Any] = []
        self.delivered: list[Any] = []
        self.index = self

        def deliver(_queue: Any, _run: Any, consumer: Any, share: list[int], flags: Any) -> tuple[int, int, int]:
            self.delivered.append((consumer, share, flags))
            return len(share), 0, 0

        monkeypatch.setattr(stored_runs, "STORED_FRAMES_COMPILED", True)
        monkeypatch.setattr(stored_runs, "deliver_stored", deliver)

    def split_taken(self, taken: list[int], parts: list[list[int]]) -> None:
        self.splits.append(parts)

    def round(self, picks: list[Any], positions: list[int], flags: list[bool] | None = None) -> bool:
        return stored_runs.deliver_stored_round(self, picks, False, positions, flags)


def test_a_round_shared_by_two_consumers_of_one_channel_goes_as_each_one_s_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each consumer's share as one run, one after the other on their channel, as the general round
    gives them (consumer_set._deliver_stretches)."""
    queue = RecordedRound(monkeypatch)
    one, other = FakeChannel(), FakeChannel()
    x, y, z = FakeReader(one), FakeReader(one), FakeReader(other)
    assert queue.round([x, y, x, y], [1, 2, 3, 4])
    assert [share for _, share, _ in queue.delivered] == [[1, 3], [2, 4]] and queue.splits == [[[1, 3], [2, 4]]]
    assert queue.round([x, z, x, z, x], [1, 2, 3, 4, 5])
    assert [share for _, share, _ in queue.delivered[2:]] == [[1, 3, 5], [2, 4]]
    assert queue.splits[1:] == [[[1, 3, 5], [2, 4]]]


def test_whole_rounds_of_many_consumers_go_as_each_one_s_run_with_its_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    """More than 8 consumers (some sharing a channel) in whole rounds and a part of one: each one's share
    and redelivered flags by slices; uneven picks of that many are left to the caller's read."""
    queue = RecordedRound(monkeypatch)
    channels = [FakeChannel() for _ in range(5)]
    readers = [FakeReader(channels[i % 5]) for i in range(10)]
    picks = readers * 2 + readers[:3]
    positions = list(range(100, 123))
    flags = [i % 3 == 0 for i in range(23)]
    assert queue.round(picks, positions, flags)
    assert queue.delivered == [(reader, positions[j::10], flags[j::10]) for j, reader in enumerate(readers)]
    assert queue.splits == [[positions[j::10] for j in range(10)]]
    uneven = readers * 2 + readers[3:4]
    assert not queue.round(uneven, positions[:21], flags[:21])
    assert len(queue.delivered) == 10


def test_a_quorum_queue_s_read_is_the_general_way_s(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its requeued messages carry x-delivery-count (its feature path, a message at a time), the rest go
    as runs: the same bytes and books either way."""
    data, deliveries, books = read_deliveries(tmp_path / "segments", None, False, "quorum")
    monkeypatch.setattr(classic_queue, "stored_run_of", lambda consumer: None)
    general = read_deliveries(tmp_path / "general", None, False, "quorum")
    assert data == general[0] and books == general[2]
    assert data.count(b"x-delivery-count") == REQUEUED
    assert [b for _, _, b in deliveries] == [body_of(i) for i in range(COUNT)]


def test_a_reader_s_connection_closed_by_the_broker_mid_read_gives_back_all_it_held(
        tmp_path: Path, framed: list[int]) -> None:
    """Two readers on connections of their own take rounds' shares (framed from the segments when compiled);
    one has acked part of its share when the broker closes its connection (as the HTTP API's connection
    delete does, its deliveries framed and still unread): what it had not acked comes again, redelivered,
    to the other, and every message is acked exactly once with nothing left on the queue."""
    harness = Harness(tmp_path, fsync="never")
    try:
        publisher = harness.open_client()
        publish_all(harness, publisher)
        queue = harness.broker.vhosts["/"].queues["q"]
        readers = [harness.open_client(("127.0.0.1", 40000 + i)) for i in range(2)]
        for reader, tag in zip(readers, ("x", "y"), strict=True):
            reader.send((1, commands.Basic.Qos(prefetch_count=30)),
                        (1, commands.Basic.Consume(queue="q", consumer_tag=tag)))
        harness.run_soon()
        held = [deliveries_of(b"".join(reader.conn.data_to_send())) for reader in readers]
        assert [len(h) for h in held] == [30, 30]
        assert sum(framed) == (59 if sf.STORED_FRAMES_COMPILED else 0)  # all but the large record (body_of(40))
        closed, survivor = readers
        acked = [body for _tag, _again, body in held[0][:12]]
        closed.send((1, commands.Basic.Ack(delivery_tag=held[0][11][0], multiple=True)))
        harness.run_soon()  # the ack refills its window: 12 more framed, sent, never read by the client
        refill = deliveries_of(b"".join(closed.conn.data_to_send()))
        assert [tag for tag, _again, _body in refill] == list(range(31, 43))
        closed.conn.close(320, "CONNECTION_FORCED - Closed via management plugin")
        given_back = sorted(body for _tag, _again, body in held[0][12:] + refill)
        again: list[bytes] = []
        mine = held[1]
        while mine:
            acked += [body for _tag, _again, body in mine]
            again += [body for _tag, redelivered, body in mine if redelivered]
            survivor.send((1, commands.Basic.Ack(delivery_tag=mine[-1][0], multiple=True)))
            harness.run_soon()
            mine = deliveries_of(b"".join(survivor.conn.data_to_send()))
        assert sorted(again) == given_back
        assert sorted(acked) == sorted(body_of(i) for i in range(COUNT))
        assert (queue.message_count, queue.unacked_count) == (0, 0)
    finally:
        harness.close()


def deliveries_of(data: bytes) -> list[tuple[int, bool, bytes]]:
    """The basic.deliver frames in ``data`` as (tag, redelivered, body)."""
    out: list[list[Any]] = []
    for _channel, value in parse(data):
        if isinstance(value, commands.Basic.Deliver):
            out.append([value.delivery_tag, value.redelivered, b""])
        elif isinstance(value, body.ContentBody):
            out[-1][2] += value.value
    return [(tag, again, whole) for tag, again, whole in out]
