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

import bisect
import datetime as _dt
import struct
import time
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, cast

from pamqp import commands

from lavinpy.wire.buffers import drop_front
from lavinpy.wire.client import BASIC_DELIVER, encode_shortstr, method_id, parse_deliver, parse_header
from lavinpy.wire.constants import FRAME_BODY, FRAME_HEADER, FRAME_METHOD
from lavinpy.wire.delivery_columns import OFFSET_HEADER, STOP_FULL, STOP_OTHER, DeliveryColumns, split_offset
from lavinpy.wire.field_table import encode_table
from lavinpy.wire.frames import build_method
from lavinpy.wire.properties import property_values
from lavinpy.wire.writer import basic_ack

from .client import (
    AMQPClientError,
    AMQPParams,
    BrokerClosed,
    Connection,
    ConnectionLost,
    connection_gone,
    reconnecting,
    server_product,
)
from .options import STREAM_PREFETCH

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
        f"queue {queue!r} is not a stream queue ({detail}), but it is read as one: leave the option "
        f"queueType at auto (the default) or set it to classic or quorum, and leave out the stream "
        f"options (startingOffset, endingOffset, maxMessagesPerPartition)")


class Delivery(NamedTuple):
    """One stream message. A tuple, because a reader creates hundreds of thousands per second."""

    offset: int
    exchange: str
    routing_key: str
    properties: list[Any]  # ordered as lavinpy.wire.properties.PROPERTY_NAMES; headers without x-stream-offset
    body: bytes


class StreamClient:
    """Stream operations on one queue through one Connection (opened lazily, reopened on failure)."""

    def __init__(self, params: AMQPParams, queue: str, prefetch: int = STREAM_PREFETCH,
                 conn: Connection | None = None) -> None:
        self.params = params
        self.queue = queue
        self.prefetch = max(1, min(prefetch, 65535))
        self._conn: Connection | None = conn  # given: the client's from now on (it closes it)

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
        """Run fn (a driver-side probe); when the connection is lost or the broker closes it (a broker
        restarting), run it again on a fresh connection, trying for the url's timeout."""
        try:
            return fn(*args)
        except (ConnectionLost, BrokerClosed) as exc:
            if not connection_gone(exc):
                raise
        self.close()
        return reconnecting(lambda: fn(*args), self.params.timeout, self.close)

    # --- queue checks -----------------------------------------------------------------------------
    def message_count(self) -> int:
        """queue.declare-ok's message count (passive); StreamReadError if the queue is missing."""
        return self._retrying(self._message_count)

    def _message_count(self) -> int:
        conn = self.conn
        ch = conn.open_channel()
        try:
            ok = conn.call(ch, build_method(commands.Queue.Declare, queue=self.queue, passive=True),
                           commands.Queue.DeclareOk)
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
            conn.call(ch, build_method(commands.Queue.Declare, queue=self.queue, durable=True,
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
            for offset in self._offsets(ch, first_wait=wait, idle_wait=wait):
                return offset
            return None
        finally:
            self.conn.close_channel(ch)

    def end_offset(self) -> int | None:
        """The offset after the last message now in the stream (exclusive end); None if empty.

        lavinpy starts a consumer at "last" on the newest message and counts exactly: its end is the
        offset of that one delivery plus one (none when the count is 0), with no pause to wait out.
        Other brokers (RabbitMQ), robust against their semantics and against retention moving the head:
        1. queue.declare-ok gives the message count c (lavinpy: exact; RabbitMQ: 0, or lagging).
        2. If c > 0, the oldest offset F is probed and F + c - 1 is the expected last offset; a
           consumer starts *at* that offset, so it gets one message (or a few, if more arrived or
           the count lagged, as RabbitMQ's does) instead of a whole chunk or segment.
        3. If c == 0 (empty, or a broker that does not count stream messages), the estimate
           pointed past the end (retention moved F between 1 and 2), or more than the estimate's
           one message came (messages arrived, or the count lagged: RabbitMQ's can lag by half a
           stream, more than the 1 s read covers), a consumer starts at "last" too -- the last
           message or the start of the last chunk, depending on the broker -- and the higher end
           of the two counts.
        Each consumer reads until deliveries pause for 50 ms (at most 1 s), and only an offset
        seen in a delivery is returned, never the estimate itself, so readers are never asked to
        wait for messages that do not exist.
        """
        return self._retrying(self._end_offset)

    def _end_offset(self) -> int | None:
        count = self._message_count()
        if _newest_at_last(self.conn):
            if count == 0:
                return None
            newest = self._probe("last", self.params.timeout)
            return None if newest is None else newest + 1
        last = None
        if count > 0:
            first = self._probe("first", self.params.timeout)
            if first is None:
                return None
            last, seen, quiet = self._read_to_quiet(first + count - 1, self.params.timeout)
            if seen == 1 and quiet:
                return cast(int, last) + 1  # the count was exact: the estimate was the last message
        # No count, an estimate past the end, or one the stream outran (RabbitMQ's count lags: 3.10
        # counted 485,781 of 999,424 confirmed messages, more than the capped read above covers):
        # "last" starts at the last message (lavinpy) or the last chunk's first (RabbitMQ).
        tail, _seen, _quiet = self._read_to_quiet("last", _EMPTY_PROBE_S)
        ends = [offset for offset in (last, tail) if offset is not None]
        return max(ends) + 1 if ends else None

    def _read_to_quiet(self, spec: Any, first_wait: float) -> tuple[int | None, int, bool]:
        """Highest offset delivered to a consumer started at spec before deliveries pause, how many
        were delivered, and whether they did pause (False: the read was cut at its time bound, so
        that a busy stream cannot keep the probe running)."""
        ch = self._consume(spec, prefetch=self.prefetch)
        last = None
        seen = 0
        quiet = True
        deadline = time.monotonic() + _END_MAX_S
        try:
            for offset in self._offsets(ch, first_wait=first_wait, idle_wait=_END_IDLE_S):
                last = offset if last is None else max(last, offset)
                seen += 1
                if time.monotonic() > deadline:
                    quiet = False
                    break
        finally:
            self.conn.close_channel(ch)
        return last, seen, quiet

    # --- reading ----------------------------------------------------------------------------------
    def read_range(self, start: int, end: int, stall_timeout: float = 120.0) -> Iterator[Delivery]:
        """Yield every message with start <= offset < end, in offset order, then stop (see read_range_into)."""
        sink = ColumnsSink(batch_rows=8192)
        for lo, hi in self.read_range_into(sink, start, end, stall_timeout):
            cols = sink.take()
            for row, (offset, exchange, routing_key, props, body) in enumerate(cols.deliveries()):
                if lo <= row < hi:
                    yield Delivery(cast(int, offset), exchange, routing_key, props, body)

    def read_range_into(self, sink: ColumnsSink, start: int, end: int, stall_timeout: float = 120.0,
                        then_close: bool = False) -> Iterator[tuple[int, int]]:
        """Read every message with start <= offset < end, in offset order, into sink.columns, then stop.

        Yields (lo, hi) whenever the columns hold sink.batch_rows rows (or their bodies sink.batch_bytes)
        and at the end: the rows in the range are lo <= row < hi. The caller takes the columns then
        (sink.take()); a broker may start before ``start`` (at its chunk's beginning).
        Messages removed by retention are skipped: if the reader is idle for a while, it checks the
        stream's oldest offset and ends early when the rest of the range is gone. then_close: once the
        range is read, the connection closes without a wait (close_soon; a Spark task's end), where it
        otherwise closes the consumer's channel and waits for the close-ok.
        """
        if end <= start:
            return
        prefetch = min(self.prefetch, end - start)  # a short range's first credit stops at its end too
        ch = self._consume(start, prefetch=prefetch)
        receiver = _StreamReceiver(self.conn, ch, self.queue, prefetch, end)
        last_seen = start - 1
        self._stalled_since: float | None = None
        read = False  # the whole range: only then does then_close apply
        try:
            while True:
                stalled = True
                for _added in receiver.receive(sink, first_wait=_STALL_PROBE_S, idle_wait=_STALL_PROBE_S):
                    stalled = False
                    offsets = sink.columns.offset_values
                    last_seen = offsets[-1] if offsets else last_seen
                    self._stalled_since = None
                    done = last_seen >= end - 1
                    if done or sink.full():
                        yield _range_rows(offsets, start, end)
                    if done:
                        read = True
                        return
                if stalled and self._range_gone(last_seen + 1, end, stall_timeout):
                    if sink.columns.rows:
                        yield _range_rows(sink.columns.offset_values, start, end)
                    read = True
                    return
        finally:
            if read and then_close and self._conn is not None:
                self._conn.close_soon()  # the stream's credit ends at the range: little is in flight
                self._conn = None
            elif self._conn is not None and self._conn.sock is not None:
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
            if exc.reply_code == 403:  # the refusal names the queue and the user; the offset is beside it
                raise StreamReadError(f"cannot read queue {self.queue!r}: {exc.reply_code} {exc.reply_text}") from exc
            raise StreamReadError(f"cannot consume from {self.queue!r} at {spec!r}: "
                                  f"{exc.reply_code} {exc.reply_text}") from exc

    def _offsets(self, ch: int, first_wait: float, idle_wait: float) -> Iterator[int]:
        """The offsets of the deliveries on channel ch until none arrives for idle_wait (first_wait for
        the first)."""
        sink = ColumnsSink()
        for _added in _StreamReceiver(self.conn, ch, self.queue, self.prefetch).receive(sink, first_wait, idle_wait):
            yield from sink.take().offset_values


def _newest_at_last(conn: Connection) -> bool:
    """Whether the broker starts a consumer at "last" on the stream's newest message itself, as lavinpy
    does and counts a stream's messages exactly (RabbitMQ starts it at the last chunk's first)."""
    return server_product(conn) == "lavinpy"


def _range_rows(offsets: Sequence[int], start: int, end: int) -> tuple[int, int]:
    """The rows lo <= row < hi of offsets (in order) with start <= offset < end."""
    lo = 0 if not offsets or offsets[0] >= start else bisect.bisect_left(offsets, start)
    hi = len(offsets) if not offsets or offsets[-1] < end else bisect.bisect_left(offsets, end)
    return lo, max(lo, hi)


class ColumnsSink:
    """Where a Receiver appends deliveries: ``columns``, taken by the reader a batch at a time."""

    def __init__(self, batch_rows: int = 1 << 62, batch_bytes: int = 64 << 20) -> None:
        self.batch_rows = batch_rows
        self.batch_bytes = batch_bytes
        self.columns = DeliveryColumns()

    def full(self) -> bool:
        cols = self.columns
        return cols.rows >= self.batch_rows or cols.data_len >= self.batch_bytes

    def room(self) -> int:
        """Rows the columns take before they are full (a scan stops there: a batch's columns are then
        as long as the one's before, whose room the next one gets)."""
        return max(1, self.batch_rows - self.columns.rows)

    def take(self) -> DeliveryColumns:
        """The columns filled so far; new ones take their place, with room for as many rows and a
        quarter more body bytes (growing a column copies it)."""
        cols = self.columns
        self.columns = DeliveryColumns(max(16, min(cols.rows, self.batch_rows)), cols.data_len + cols.data_len // 4)
        return cols


class Receiver:
    """A consumer's deliveries on one channel appended to a sink's columns, a receive buffer at a time.

    Whole messages (deliver + header + one body frame) are appended straight from the receive buffer
    by one call (DeliveryColumns.scan); when it stops at anything else -- a body split over frames, a
    frame for another channel, a close -- the generic frame path (_Assembler) takes over until a
    message is whole again; when it stops because the bytes ran out, the reader waits for more.
    """

    def __init__(self, conn: Connection, ch: int, queue: str) -> None:
        self.conn = conn
        self.ch = ch
        self.assembler = _Assembler(ch, queue)
        self.pending: deque[tuple[int, Delivery, bool]] = deque()  # generic deliveries past a limit
        self.last_tag = 0

    def receive(self, sink: ColumnsSink, first_wait: float, idle_wait: float,
                limit: int | None = None) -> Iterator[int]:
        """Yields how many deliveries were appended to sink.columns each time some came (the caller may
        take the columns then), until none comes for idle_wait (first_wait for the first) or limit
        came; what comes past the limit, or past the sink's room, stays for the next call. Once the
        columns' bodies near 2 GiB, it yields 0 until the caller takes them."""
        conn = self.conn
        buf = conn.rbuf
        assembler = self.assembler
        wait = first_wait
        got = 0
        while limit is None or got < limit:
            room = sink.room() if limit is None else min(limit - got, sink.room())
            cols = sink.columns
            added = 0
            stop = STOP_OTHER
            if self.pending:
                while self.pending and added < room:
                    tag, d, redelivered = self.pending.popleft()
                    cols.append(tag, d.offset, d.exchange, d.routing_key, d.properties, d.body, redelivered)
                    added += 1
            elif assembler.idle and not conn.has_backlog:
                added, used, stop = cols.scan(buf, self.ch, 0, room)
                if used:
                    drop_front(buf, used)
            if not added and stop == STOP_OTHER and (conn.has_backlog or _complete_frame_at_front(buf)):
                for frame in conn.read_frames(0):
                    item = assembler.feed(frame)
                    if item is None:
                        continue
                    tag, d = item
                    if added < room:
                        cols.append(tag, d.offset, d.exchange, d.routing_key, d.properties, d.body,
                                    assembler.redelivered)
                        added += 1
                    else:
                        self.pending.append((tag, d, assembler.redelivered))
            if added or stop == STOP_FULL:
                if added:
                    cols.decode()
                    self.last_tag = cols.last_tag
                got += added
                yield added
                wait = idle_wait
                continue
            if not conn.wait_readable(wait):
                return
            wait = idle_wait


_FRAME_HEAD = struct.Struct(">BHI")


def _complete_frame_at_front(buf: bytearray) -> bool:
    if len(buf) < 8:
        return False
    return len(buf) >= 8 + _FRAME_HEAD.unpack_from(buf, 0)[2]


class _StreamReceiver(Receiver):
    """A stream consumer's Receiver: every delivery must carry its offset, and acks are credit, not
    removal, sent (multiple) once half the prefetch is unacked.

    Given ``end`` (the offset after the last one wanted), it never grants credit past it: the broker
    then sends nothing the reader would only drop, which at a channel's close would come through the
    generic frame path, up to a whole prefetch of it.
    """

    def __init__(self, conn: Connection, ch: int, queue: str, prefetch: int, end: int | None = None) -> None:
        super().__init__(conn, ch, queue)
        self.queue = queue
        self.prefetch = prefetch
        self.ack_every = max(1, prefetch // 2)
        self.end = end
        self.acked_tag = 0

    def receive(self, sink: ColumnsSink, first_wait: float, idle_wait: float,
                limit: int | None = None) -> Iterator[int]:
        for added in super().receive(sink, first_wait, idle_wait, limit):
            cols = sink.columns
            if cols.missing:
                raise not_a_stream(self.queue, "its deliveries carry no x-stream-offset header")
            last_tag = self.last_tag
            if added and last_tag - self.acked_tag >= self.ack_every:
                upto = last_tag
                if self.end is not None:
                    # Credit reaches upto + prefetch; offsets run on with tags (or skip some, which
                    # only lets a few more through), so this stops at end - 1.
                    still_wanted = self.end - 1 - cols.offset_values[cols.rows - 1]
                    upto = min(upto, last_tag + still_wanted - self.prefetch)
                if upto > self.acked_tag:
                    self.conn.send(basic_ack(self.ch, upto, True))
                    self.acked_tag = upto
            yield added


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
        offset = cast(int, split_offset(self.props))
        return tag, Delivery(offset, exchange, routing_key, self.props, body)


_U16 = struct.Struct(">H")
_READER_TAG = "s"
_TRACKING_ARGUMENT = "x-stream-automatic-offset-tracking"


def _consume_payload(queue: str, arguments: dict[str, Any]) -> bytes:
    """basic.consume with manual ack (arguments encoded by the shared field-table codec).

    The tag is one letter (tags are per channel, and each reader has its channel): every delivery
    carries it, and a broker-made ``amq.ctag-`` one is 30 bytes longer, an eighth of a 100-byte
    message's frames. A stream broker tracks a named consumer's offset (LavinMQ does, and lavinpy as it does),
    which the reader never wants -- its position is the range Spark gave it -- so it says
    ``x-stream-automatic-offset-tracking: false``; a broker that does not know the argument ignores
    it (RabbitMQ tracks no AMQP 0-9-1 consumer)."""
    return (_U16.pack(60) + _U16.pack(20) + b"\x00\x00" + encode_shortstr(queue) + encode_shortstr(_READER_TAG)
            + b"\x00" + encode_table({**arguments, _TRACKING_ARGUMENT: False}))
