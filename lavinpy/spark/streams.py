"""Reading stream queues over plain AMQP 0-9-1 (the contract RabbitMQ and lavinpy implement).

- a consumer picks its start with the consume argument `x-stream-offset` (an offset, "first",
  "last", "next" or a timestamp), must set a prefetch and use manual acks (acks are credit);
- every delivery carries its offset in the `x-stream-offset` header;
- messages are never removed by consumers: reading a range twice yields the same messages, which
  is what makes Spark's checkpointed replay exact.

Offsets here are always *exclusive ends* / *next offset to read*, as in Kafka: a range
[start, end) holds the messages with start <= offset < end.
"""

from __future__ import annotations

import datetime as _dt
import struct
import time
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, cast

from pamqp import commands

from lavinpy.wire.client import (
    BASIC_DELIVER,
    STREAM_OFFSET_ENTRY,
    encode_shortstr,
    int64_bounds,
    method_id,
    parse_deliver,
    parse_header,
    scan_stream_deliveries,
    stamped_offset_at,
)
from lavinpy.wire.constants import FRAME_BODY, FRAME_HEADER, FRAME_METHOD
from lavinpy.wire.field_table import encode_table
from lavinpy.wire.joined_bodies import JoinedBodies
from lavinpy.wire.properties import headers_span, property_values
from lavinpy.wire.writer import basic_ack

from .client import AMQPClientError, AMQPParams, BrokerClosed, Connection, ConnectionLost

OFFSET_HEADER = "x-stream-offset"
_BASIC_CANCEL = (60 << 16) | 30
_EMPTY_PROBE_S = 0.2     # how long "no delivery" must last before a stream counts as empty
_END_IDLE_S = 0.05       # quiet time that ends the read of the last chunk in end_offset()
_END_MAX_S = 1.0         # end_offset() stops chasing a busy stream after this long
_STALL_PROBE_S = 5.0     # a range reader idle this long checks whether retention removed its range


class StreamReadError(AMQPClientError):
    """The queue cannot be read as a stream (missing, not a stream, cancelled...)."""


class NotAStreamError(StreamReadError):
    pass


def not_a_stream(queue: str, detail: str) -> NotAStreamError:
    return NotAStreamError(
        f"queue {queue!r} is not a stream queue ({detail}). The lavinpy Spark source reads only stream "
        f"queues, which keep their messages so that offset ranges can be read and replayed: declare a "
        f"durable queue with the argument x-queue-type=stream, bind it like the classic queue, and read "
        f"that instead.")


class Delivery(NamedTuple):
    """One stream message. A tuple, because a reader creates hundreds of thousands per second."""

    offset: int
    exchange: str
    routing_key: str
    properties: list[Any]  # ordered as lavinpy.wire.properties.PROPERTY_NAMES; headers without x-stream-offset
    body: bytes


class DeliveryChunk(NamedTuple):
    """Consecutive deliveries as columns, one list each, in delivery order: what a reader hands to
    Arrow at once. Deliveries with the same properties share one property list (read-only)."""

    offsets: list[int]
    exchanges: list[str]
    routing_keys: list[str]
    properties: list[list[Any]]
    bodies: Sequence[bytes]  # a list, or a scan's JoinedBodies

    @classmethod
    def of_rows(cls, rows: list[Delivery]) -> DeliveryChunk:
        return cls(*(list(column) for column in zip(*rows, strict=True)))

    def rows(self) -> Iterator[Delivery]:
        return map(Delivery, *self)

    def head(self, n: int) -> DeliveryChunk:
        return DeliveryChunk._make(column[:n] for column in self)

    def keep(self, indices: list[int]) -> DeliveryChunk:
        return DeliveryChunk._make([column[i] for i in indices] for column in self)


class StreamClient:
    """Stream operations on one queue through one Connection (opened lazily, reopened on failure)."""

    def __init__(self, params: AMQPParams, queue: str, prefetch: int = 2000) -> None:
        self.params = params
        self.queue = queue
        self.prefetch = max(1, min(prefetch, 65535))
        self._conn: Connection | None = None

    # --- connection -------------------------------------------------------------------------------
    @property
    def conn(self) -> Connection:
        if self._conn is None or self._conn.sock is None:
            self._conn = Connection(self.params).open()
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> StreamClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _retrying(self, fn: Any, *args: Any) -> Any:
        """Run fn once more on a fresh connection if the connection was lost (driver-side probes)."""
        try:
            return fn(*args)
        except BrokerClosed as exc:
            if exc.scope == "connection":
                self.close()
            raise
        except ConnectionLost:
            self.close()
            return fn(*args)

    # --- queue checks -----------------------------------------------------------------------------
    def message_count(self) -> int:
        """queue.declare-ok's message count (passive); StreamReadError if the queue is missing."""
        return self._retrying(self._message_count)

    def _message_count(self) -> int:
        conn = self.conn
        ch = conn.open_channel()
        try:
            ok = conn.call(ch, commands.Queue.Declare(queue=self.queue, passive=True), commands.Queue.DeclareOk)
        except BrokerClosed as exc:
            if exc.reply_code == 404:
                raise StreamReadError(f"queue {self.queue!r} not found in vhost {self.params.vhost!r}: declare it "
                                      f"as a stream queue (durable, x-queue-type=stream) first") from exc
            raise StreamReadError(f"cannot inspect queue {self.queue!r}: {exc.reply_code} {exc.reply_text}") from exc
        conn.close_channel(ch)
        return int(ok.message_count)

    def check_is_stream(self) -> None:
        """Refuse queues that are certainly not streams (classic, quorum...).

        The only side-effect-free signal over AMQP 0-9-1 is a re-declare with x-queue-type=stream:
        it succeeds on a stream without other arguments and fails with 406 naming the first
        argument that differs otherwise. A mismatch on x-queue-type or on durable/exclusive/
        auto_delete proves the queue is not a stream; a mismatch on another argument (a stream
        with retention settings, or a classic queue with x-max-length...) is inconclusive, and
        then the first delivery decides: a delivery without an x-stream-offset header raises
        NotAStreamError (see _deliveries).
        """
        self.message_count()  # 404 -> clear error first
        conn = self.conn
        ch = conn.open_channel()
        try:
            conn.call(ch, commands.Queue.Declare(queue=self.queue, durable=True,
                                                 arguments={"x-queue-type": "stream"}), commands.Queue.DeclareOk)
        except BrokerClosed as exc:
            if exc.scope == "connection":
                self.close()
                raise
            text = exc.reply_text
            if exc.reply_code == 406 and ("'x-queue-type'" in text or "queue type" in text):
                raise not_a_stream(self.queue, text) from exc
            if exc.reply_code == 406 and any(f"'{arg}'" in text for arg in ("durable", "exclusive", "auto_delete")):
                raise not_a_stream(self.queue, text) from exc
            return  # inconclusive (other arguments, or no configure permission)
        conn.close_channel(ch)

    # --- offsets ----------------------------------------------------------------------------------
    def first_offset(self, wait: float | None = None) -> int | None:
        """Offset of the oldest message still in the stream, or None if it stays empty for `wait`."""
        return self._retrying(self._probe, "first", _EMPTY_PROBE_S if wait is None else wait)

    def offset_at(self, when: _dt.datetime, wait: float | None = None) -> int | None:
        """First offset at or after a time (the broker's timestamp lookup), None if nothing is newer."""
        if when.tzinfo is None:
            when = when.replace(tzinfo=_dt.UTC)
        return self._retrying(self._probe, when, _EMPTY_PROBE_S if wait is None else wait)

    def _probe(self, spec: Any, wait: float) -> int | None:
        """Offset of the first delivery of a consumer started at `spec`, or None after `wait`."""
        ch = self._consume(spec, prefetch=1)
        try:
            for delivery in self._deliveries(ch, first_wait=wait, idle_wait=wait):
                return delivery.offset
            return None
        finally:
            self.conn.close_channel(ch)

    def end_offset(self) -> int | None:
        """The offset after the last message now in the stream (exclusive end); None if empty.

        Robust against both brokers' semantics and against retention moving the head:
        1. queue.declare-ok gives the message count c (lavinpy: exact; RabbitMQ: 0, or lagging).
        2. If c > 0, the oldest offset F is probed and F + c - 1 is the expected last offset; a
           consumer starts *at* that offset, so it gets one message (or a few, if more arrived or
           the count lagged, as RabbitMQ's does) instead of a whole chunk or segment.
        3. If c == 0 (empty, or a broker that does not count stream messages) or the estimate
           pointed past the end (retention moved F between 1 and 2), a consumer starts at "last"
           -- the last message or the start of the last chunk, depending on the broker.
        Either consumer reads until deliveries pause for 50 ms (at most 1 s), and only an offset
        seen in a delivery is returned, never the estimate itself, so readers are never asked to
        wait for messages that do not exist. The pause is waited for even when the estimate's
        offset came: RabbitMQ's count of a stream lags (3.10 counted 937,375 of 1,000,000 confirmed
        messages), so messages past the estimate can exist.
        """
        return self._retrying(self._end_offset)

    def _end_offset(self) -> int | None:
        count = self._message_count()
        start: Any = "last"
        if count > 0:
            first = self._probe("first", self.params.timeout)
            if first is None:
                return None
            start = first + count - 1
        last = self._read_to_quiet(start, self.params.timeout if count > 0 else _EMPTY_PROBE_S)
        if last is None and start != "last":
            last = self._read_to_quiet("last", _EMPTY_PROBE_S)  # the estimate was past the end
        return None if last is None else last + 1

    def _read_to_quiet(self, spec: Any, first_wait: float) -> int | None:
        """Highest offset delivered to a consumer started at spec before deliveries pause.

        Bounded in time so that a busy stream cannot keep the probe running.
        """
        ch = self._consume(spec, prefetch=self.prefetch)
        last = None
        deadline = time.monotonic() + _END_MAX_S
        try:
            for delivery in self._deliveries(ch, first_wait=first_wait, idle_wait=_END_IDLE_S):
                last = delivery.offset if last is None else max(last, delivery.offset)
                if time.monotonic() > deadline:
                    break
        finally:
            self.conn.close_channel(ch)
        return last

    # --- reading ----------------------------------------------------------------------------------
    def read_range(self, start: int, end: int, stall_timeout: float = 120.0) -> Iterator[Delivery]:
        """Yield every message with start <= offset < end, in offset order, then stop.

        Messages removed by retention are skipped: if the reader is idle for a while, it checks the
        stream's oldest offset and ends early when the rest of the range is gone.
        """
        for chunk in self.read_range_chunks(start, end, stall_timeout):
            yield from chunk.rows()

    def read_range_chunks(self, start: int, end: int, stall_timeout: float = 120.0) -> Iterator[DeliveryChunk]:
        """``read_range`` a receive buffer's deliveries at a time, as columns."""
        if end <= start:
            return
        ch = self._consume(start, prefetch=self.prefetch)
        last_seen = start - 1
        self._stalled_since: float | None = None
        try:
            while True:
                stalled = True
                for chunk in self._delivery_chunks(ch, first_wait=_STALL_PROBE_S, idle_wait=_STALL_PROBE_S):
                    stalled = False
                    chunk, done = _in_range(chunk, start, end)
                    if chunk.offsets:
                        last_seen = chunk.offsets[-1]
                        self._stalled_since = None
                        yield chunk
                    if done:
                        return
                if stalled and self._range_gone(last_seen + 1, end, stall_timeout):
                    return
        finally:
            if self._conn is not None and self._conn.sock is not None:
                try:
                    self._conn.close_channel(ch)
                except AMQPClientError:
                    self.close()

    def _range_gone(self, next_offset: int, end: int, stall_timeout: float) -> bool:
        """After a stall: True if retention removed [next_offset, end); raises after stall_timeout."""
        with StreamClient(self.params, self.queue, prefetch=1) as probe:
            first = probe.first_offset()
        if first is None or first >= end:
            return True
        if self._stalled_since is None:
            self._stalled_since = time.monotonic()
        if time.monotonic() - self._stalled_since > stall_timeout:
            raise StreamReadError(f"no message from stream {self.queue!r} for {stall_timeout:.0f}s while reading "
                                  f"offsets {next_offset}..{end - 1} (the oldest offset is {first})")
        return False

    # --- consumer primitives ----------------------------------------------------------------------
    def _consume(self, spec: Any, prefetch: int) -> int:
        try:
            return self.conn.open_consumer(prefetch, _consume_payload(self.queue, {OFFSET_HEADER: spec}))
        except BrokerClosed as exc:
            if exc.scope == "connection":
                self.close()
            if exc.reply_code == 404:
                raise StreamReadError(f"queue {self.queue!r} not found in vhost {self.params.vhost!r}") from exc
            raise StreamReadError(f"cannot consume from {self.queue!r} at {spec!r}: "
                                  f"{exc.reply_code} {exc.reply_text}") from exc

    def _deliveries(self, ch: int, first_wait: float, idle_wait: float) -> Iterator[Delivery]:
        """Deliveries on channel ch until none arrives for idle_wait (first_wait for the first)."""
        for chunk in self._delivery_chunks(ch, first_wait, idle_wait):
            yield from chunk.rows()

    def _delivery_chunks(self, ch: int, first_wait: float, idle_wait: float) -> Iterator[DeliveryChunk]:
        """``_deliveries`` a receive buffer at a time.

        Whole messages (deliver + header + one body frame) are parsed straight from the receive
        buffer into columns by one call (scan_stream_deliveries); when it stops at anything else -- a
        body split over frames, a frame for another channel, a close -- the generic frame path
        (_Assembler) takes over until a message is whole again; when it stops because the bytes ran
        out, the reader waits for more. Acks (multiple) once half the prefetch is unacked: for a
        stream an ack is credit, not removal.
        """
        conn = self.conn
        buf = conn.rbuf
        ack_every = max(1, self.prefetch // 2)
        unacked = 0
        wait = first_wait
        assembler = _Assembler(ch, self.queue)
        while True:
            chunk = None
            generic = True
            if assembler.idle and not conn.has_backlog:
                offsets, exchanges, routing_keys, blocks, joined, last_tag, used, generic = \
                    scan_stream_deliveries(buf, ch, joined=True)
                if used:  # the bodies joined: no bytes object a delivery (read_rows joins a batch's)
                    chunk = _chunk(offsets, exchanges, routing_keys, blocks, JoinedBodies.of_scan(joined))
                    del buf[:used]
            if chunk is None and generic and (conn.has_backlog or _complete_frame_at_front(buf)):
                rows = [item for frame in conn.read_frames(0) if (item := assembler.feed(frame)) is not None]
                if rows:
                    last_tag = rows[-1][0]
                    chunk = DeliveryChunk.of_rows([delivery for _tag, delivery in rows])
            if chunk is not None:
                # int64_bounds: one pass in C (``in`` compares each offset with None through its type)
                if int64_bounds(chunk.offsets) is None and None in chunk.offsets:
                    raise not_a_stream(self.queue, "its deliveries carry no x-stream-offset header")
                unacked += len(chunk.offsets)
                if unacked >= ack_every:
                    conn.send(basic_ack(ch, last_tag, True))
                    unacked = 0
                yield chunk
                wait = idle_wait
                continue
            if not conn.wait_readable(wait):
                return
            wait = idle_wait


def _in_range(chunk: DeliveryChunk, start: int, end: int) -> tuple[DeliveryChunk, bool]:
    """The chunk's deliveries with start <= offset < end, up to the first at or past end - 1; and
    whether the range is done. A broker may start before ``start`` (at its chunk's beginning)."""
    offsets = chunk.offsets
    bounds = int64_bounds(offsets)  # one pass in C, where max and min compare pair by pair
    low, high = bounds if bounds is not None else (min(offsets), max(offsets))
    if low >= start and high < end - 1:  # the usual chunk: all of it, the range not yet done
        return chunk, False
    done = False
    if high >= end - 1:
        cut = next(i for i, offset in enumerate(offsets) if offset >= end - 1)
        chunk = chunk.head(cut + 1 if offsets[cut] == end - 1 else cut)
        offsets = chunk.offsets
        done = True
    if offsets and min(offsets) < start:
        chunk = chunk.keep([i for i, offset in enumerate(offsets) if offset >= start])
    return chunk, done


def _split_offset(props: list[Any]) -> int | None:
    """Take x-stream-offset out of the headers (it becomes the offset column)."""
    headers = props[2]
    if not headers:
        return None
    offset = headers.pop(OFFSET_HEADER, None)
    if not headers:
        props[2] = None
    return offset if isinstance(offset, int) else None


_FRAME_HEAD = struct.Struct(">BHI")


def _complete_frame_at_front(buf: bytearray) -> bool:
    if len(buf) < 8:
        return False
    return len(buf) >= 8 + _FRAME_HEAD.unpack_from(buf, 0)[2]


def _chunk(offsets: list[int | None], exchanges: list[str], routing_keys: list[str], blocks: list[bytes],
           bodies: Sequence[bytes]) -> DeliveryChunk:
    """A chunk from scan_stream_deliveries' columns: each distinct property block decoded once.

    The scan shares one block object among deliveries that differ only in the value of a trailing
    x-stream-offset entry and reads that value as their offset; decoding the block confirms the entry
    is the header itself (the only one with those bytes). Otherwise, each delivery's own block (the
    shared one with its value put back) is decoded on its own.
    """
    decoded: dict[bytes, tuple[int | None, list[Any]]] = {}
    # One block for all (the usual case): list.count compares by identity first, a pass in C.
    distinct = blocks[:1] if blocks and blocks.count(blocks[0]) == len(blocks) else dict.fromkeys(blocks)
    offset_elsewhere = False  # a block without the trailing entry but with an offset found by the decode
    for block in distinct:
        offset, props = _offset_and_properties(block)
        at = stamped_offset_at(block)
        if at >= 0 and (block.find(_OFFSET_ENTRY) != at - len(_OFFSET_ENTRY)
                        or offset != int.from_bytes(block[at:at + 8], "big", signed=True)):
            return _chunk_one_by_one(offsets, exchanges, routing_keys, blocks, bodies)
        offset_elsewhere = offset_elsewhere or (at < 0 and offset is not None)
        decoded[block] = (offset, props)
    # No trailing entry: the offset, if any, is wherever the decode found it. Only such blocks leave
    # None in offsets (the scan read every trailing entry's value), so a stream's usual chunk and a
    # classic or quorum queue's (no offsets at all) take no pass per delivery here.
    if offset_elsewhere and None in offsets:
        offsets = [decoded[block][0] if offset is None else offset
                   for offset, block in zip(offsets, blocks, strict=True)]
    if len(decoded) == 1:
        properties = [next(iter(decoded.values()))[1]] * len(blocks)
    else:
        properties = [decoded[block][1] for block in blocks]
    return DeliveryChunk(offsets, exchanges, routing_keys, properties, bodies)  # type: ignore[arg-type]


def _chunk_one_by_one(offsets: list[int | None], exchanges: list[str], routing_keys: list[str],
                      blocks: list[bytes], bodies: Sequence[bytes]) -> DeliveryChunk:
    properties = []
    real_offsets = []
    for offset, block in zip(offsets, blocks, strict=True):
        at = stamped_offset_at(block)
        if at >= 0 and offset is not None:
            block = block[:at] + offset.to_bytes(8, "big", signed=True) + block[at + 8:]
        real, props = _offset_and_properties(block)
        real_offsets.append(real)
        properties.append(props)
    return DeliveryChunk(real_offsets, exchanges, routing_keys, properties, bodies)  # type: ignore[arg-type]


# The broker stamps x-stream-offset as the last header entry: a stream's deliveries differ only in
# those 8 bytes, so each distinct rest of the block is decoded once and its property list shared by
# the deliveries that carry it (Delivery.properties is read-only for its users).
_OFFSET_ENTRY = STREAM_OFFSET_ENTRY
_decoded_blocks: dict[tuple[int, bytes], list[Any]] = {}
_DECODED_MAX = 256


def _offset_and_properties(block: bytes) -> tuple[int | None, list[Any]]:
    """(x-stream-offset, properties without it) of a delivery's property block."""
    at = block.find(_OFFSET_ENTRY)
    if at < 0:
        props = property_values(block, typed=False)
        return _split_offset(props), props
    value = at + len(_OFFSET_ENTRY)
    key = (at, block[:value] + block[value + 8:])
    cached = _decoded_blocks.get(key)
    if cached is not None:
        return int.from_bytes(block[value:value + 8], "big", signed=True), cached
    props = property_values(block, typed=False)
    offset = _split_offset(props)
    # Cached only when the entry found is the header the broker stamped: the table's last entry.
    if (offset == int.from_bytes(block[value:value + 8], "big", signed=True)
            and headers_span(block)[1] == value + 8):
        if len(_decoded_blocks) >= _DECODED_MAX:
            _decoded_blocks.clear()
        _decoded_blocks[key] = props
    return offset, props


class _Assembler:
    """The generic path: builds deliveries from frames, whatever their split."""

    def __init__(self, ch: int, queue: str) -> None:
        self.ch = ch
        self.queue = queue
        self.pending: tuple[int, str, str] | None = None
        self.props: list[Any] = []
        self.size = 0
        self.parts: list[bytes] = []
        self.got = 0
        self.redelivered = False  # the flag of the delivery feed() returned last

    @property
    def idle(self) -> bool:
        return self.pending is None

    def feed(self, frame: tuple[int, int, bytes]) -> tuple[int, Delivery] | None:
        ftype, fch, payload = frame
        if fch != self.ch:
            return None
        if ftype == FRAME_METHOD:
            mid = method_id(payload)
            if mid == BASIC_DELIVER:
                tag, redelivered, exchange, routing_key = parse_deliver(payload)
                self.pending = (tag, exchange, routing_key)
                self.redelivered = redelivered
                self.parts = []
                self.got = 0
            elif mid == _BASIC_CANCEL:
                raise StreamReadError(f"the broker cancelled the consumer on {self.queue!r} (queue deleted?)")
            return None
        if self.pending is None:
            return None
        if ftype == FRAME_HEADER:
            self.size, flags = parse_header(payload)
            self.props = property_values(payload, 12, typed=False)
            if self.size:
                return None
        elif ftype == FRAME_BODY:
            self.parts.append(payload)
            self.got += len(payload)
            if self.got < self.size:
                return None
        else:
            return None
        tag, exchange, routing_key = self.pending
        self.pending = None
        body = self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)
        # A stream queue stamps x-stream-offset on every delivery (as in _chunk).
        offset = cast(int, _split_offset(self.props))
        return tag, Delivery(offset, exchange, routing_key, self.props, body)


_U16 = struct.Struct(">H")


def _consume_payload(queue: str, arguments: dict[str, Any]) -> bytes:
    """basic.consume with manual ack (arguments encoded by the shared field-table codec)."""
    return (_U16.pack(60) + _U16.pack(20) + b"\x00\x00" + encode_shortstr(queue) + encode_shortstr("")
            + b"\x00" + encode_table(arguments))
