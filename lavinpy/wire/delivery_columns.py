"""Deliveries received by a consumer, kept column by column in Arrow's layout (the Spark source's reads).

A receive buffer's whole deliveries (basic.deliver, content header, the body in one frame) are appended
by one call (``scan_columns``, compiled where built) with no Python object a delivery: the bodies joined
with their int32 ends, each delivery's stamped x-stream-offset as an int64, and the exchange, routing
key and property block once a *run* of deliveries that share them (a stream's deliveries differ only in
the stamped value). Deliveries the scan leaves (bodies split over frames, other frames) come decoded
from the generic frame path and are appended one by one (``append``).
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Iterator, Sequence
from typing import Any, cast

from lavinpy.wire.accel import cclient
from lavinpy.wire.buffers import column_room
from lavinpy.wire.constants import FRAME_END
from lavinpy.wire.properties import headers_table, property_values

__all__ = ["NO_OFFSET", "DeliveryColumns", "scan_columns", "stamped_offset_at", "whole_delivery"]

NO_OFFSET = -(1 << 63)  # a delivery without a stamped offset (int64 min: never a stream's offset)
STOP_RAN_OUT, STOP_OTHER, STOP_FULL = 0, 1, 2  # why a scan stopped
# The x-stream-offset entry a stream stamps as its headers table's last entry (name, type 'l').
STREAM_OFFSET_ENTRY = b"\x0fx-stream-offsetl"
_MAX_DATA = 0x7FFFFFFF  # Arrow binary arrays have int32 ends

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_Q_LE = struct.Struct("<q")
_I_LE = struct.Struct("<i")
_METHOD_IDS = struct.Struct(">HH")

# (next, tag, redelivered, exchange span, routing key span, block span, body span): spans are (start, stop)
WholeDelivery = tuple[int, int, bool, int, int, int, int, int, int, int, int]


def whole_delivery(buf: bytes | bytearray | memoryview, size: int, pos: int, channel: int) -> WholeDelivery | bool:
    """The delivery at ``buf[pos:size]`` with its body in at most one frame, all on ``channel``; or
    False when the bytes end before it does, True when something else is there (the generic path's).
    Twin of parse_whole_delivery (compiled)."""
    avail = size - pos
    if ((avail >= 1 and buf[pos] != 1) or (avail >= 3 and _U16.unpack_from(buf, pos + 1)[0] != channel)
            or (avail >= 11 and _METHOD_IDS.unpack_from(buf, pos + 7) != (60, 60))):
        return True
    if avail < 11:
        return False
    h = pos + 8 + _U32.unpack_from(buf, pos + 3)[0]
    if h > size:
        return False
    if buf[h - 1] != FRAME_END:
        return True
    avail = size - h
    if (avail >= 1 and buf[h] != 2) or (avail >= 3 and _U16.unpack_from(buf, h + 1)[0] != channel):
        return True
    if avail < 7:
        return False
    hlen = _U32.unpack_from(buf, h + 3)[0]
    b = h + 8 + hlen
    if hlen < 14:
        return True
    if b > size:
        return False
    if buf[b - 1] != FRAME_END:
        return True
    body_size = _U64.unpack_from(buf, h + 11)[0]
    next_pos = b
    if body_size:
        avail = size - b
        if (avail >= 1 and buf[b] != 3) or (avail >= 3 and _U16.unpack_from(buf, b + 1)[0] != channel):
            return True
        if avail < 7:
            return False
        if _U32.unpack_from(buf, b + 3)[0] != body_size:
            return True
        next_pos = b + 8 + body_size
        if next_pos > size:
            return False
        if buf[next_pos - 1] != FRAME_END:
            return True
    mend = h - 1
    p = pos + 12 + buf[pos + 11]
    if p + 10 > mend or p + 10 + buf[p + 9] + 1 > mend:
        return True
    tag = _U64.unpack_from(buf, p)[0]
    redelivered = bool(buf[p + 8] & 1)
    ex = p + 10
    p = ex + buf[p + 9]
    rk_n = buf[p]
    if p + 1 + rk_n > mend:
        return True
    body_end = next_pos - 1 if body_size else b + 7
    return (next_pos, tag, redelivered, ex, p, p + 1, p + 1 + rk_n, h + 19, b - 1, b + 7, body_end)


def stamped_offset_at(block: bytes | bytearray | memoryview) -> int:
    """Where the 8-byte value of a trailing x-stream-offset ``long`` entry starts in a property block
    (the bytes say so; the caller checks by decoding), or -1."""
    size = len(block)
    if size < 2:
        return -1
    flags = (block[0] << 8) | block[1]
    if not flags & 0x2000 or flags & 1:  # no headers, or more flag words than basic has
        return -1
    table = headers_table(block)
    if table is None:
        return -1
    start, end = table
    entry = len(STREAM_OFFSET_ENTRY)
    if end - 8 - entry < start or bytes(block[end - 8 - entry:end - 8]) != STREAM_OFFSET_ENTRY:
        return -1
    return end - 8


Columns = tuple[bytearray, bytearray, bytearray, list[int], list[tuple[Any, ...]]]


def scan_columns(buf: bytes | bytearray, channel: int, pos: int, max_rows: int, columns: Columns, rows: int,
                 data_len: int) -> tuple[int, int, int, int, int]:
    """Append the whole deliveries on ``channel`` from ``buf[pos:]`` on (at most max_rows) to columns:
    returns (added, data_len, last tag, pos after them, stop). See _cclient_columns.c for the layout;
    stop is STOP_RAN_OUT (or max_rows reached), STOP_OTHER (the generic path's turn) or STOP_FULL (the
    bodies reached 2 GiB)."""
    if cclient is not None:
        return cast("tuple[int, int, int, int, int]",
                    cclient.scan_columns(buf, channel, pos, max_rows, columns, rows, data_len))
    return _scan_columns(buf, channel, pos, max_rows, columns, rows, data_len)


def _reserve(column: bytearray, need: int) -> None:
    if need > len(column):
        cap = max(len(column), 4096)
        while cap < need:
            cap *= 2
        column.extend(bytes(cap - len(column)))


def _same_run(run: tuple[Any, ...], buf: Any, d: WholeDelivery, value_at: int) -> bool:
    _row, ex, rk, block, at = run
    if not (isinstance(ex, bytes) and isinstance(rk, bytes) and isinstance(block, bytes)):
        return False  # a run of the generic path: the next delivery starts a new one
    if at != value_at or len(block) != d[8] - d[7] or ex != buf[d[3]:d[4]] or rk != buf[d[5]:d[6]]:
        return False
    start = d[7]
    if value_at < 0:
        return block == buf[start:d[8]]
    return (block[:value_at] == buf[start:start + value_at]
            and block[value_at + 8:] == buf[start + value_at + 8:d[8]])


def _scan_columns(buf: bytes | bytearray, channel: int, pos: int, max_rows: int, columns: Columns, rows: int,
                  data_len: int) -> tuple[int, int, int, int, int]:
    offsets, ends, data, redelivered, runs = columns
    if rows < 0 or data_len < 0 or len(offsets) < 8 * rows or len(ends) < 4 * (rows + 1) or len(data) < data_len:
        raise ValueError("scan_columns: rows or data_len past the columns")
    size = len(buf)
    if not 0 <= pos <= size:
        pos = size
    view = memoryview(buf)
    try:
        added = last_tag = stop = 0
        while added < max_rows:
            d = whole_delivery(view, size, pos, channel)
            if isinstance(d, bool):
                stop = STOP_OTHER if d else STOP_RAN_OUT
                break
            body_n = d[10] - d[9]
            if data_len + body_n > _MAX_DATA:
                stop = STOP_FULL
                break
            row = rows + added
            block = bytes(view[d[7]:d[8]])
            value_at = stamped_offset_at(block)
            if not runs or not _same_run(runs[-1], buf, d, value_at):
                runs.append((row, bytes(view[d[3]:d[4]]), bytes(view[d[5]:d[6]]), block, value_at))
            _reserve(offsets, 8 * (row + 1))
            _reserve(ends, 4 * (row + 2))
            _reserve(data, data_len + body_n)
            offset = NO_OFFSET if value_at < 0 else int.from_bytes(block[value_at:value_at + 8], "big", signed=True)
            _Q_LE.pack_into(offsets, 8 * row, offset)
            data[data_len:data_len + body_n] = view[d[9]:d[10]]
            data_len += body_n
            _I_LE.pack_into(ends, 4 * (row + 1), data_len)
            if d[2]:
                redelivered.append(row)
            last_tag = d[1]
            pos = d[0]
            added += 1
        return added, data_len, last_tag, pos, stop
    finally:
        view.release()


class DeliveryColumns:
    """A batch of deliveries as columns. ``rows`` and ``data_len`` say how much of the bytearrays is
    filled (they are capacity); ``runs`` are scan runs (bytes: first row, exchange, routing key,
    property block, the stamped value's place or -1) or decoded ones appended by ``append`` (first
    row, exchange, routing key, properties, None). Once handed to Arrow, a batch's columns are left
    alone: the next batch gets new ones."""

    __slots__ = ("data", "data_len", "decoded", "decoded_rows", "ends", "last_tag", "missing", "offsets",
                 "redelivered", "rows", "runs")

    def __init__(self, rows: int = 0, data: int = 0) -> None:
        self.offsets = column_room(8 * rows)
        self.ends = column_room(4 * (rows + 1))
        self.ends[:4] = b"\0\0\0\0"  # the first body's start
        self.data = column_room(data)
        self.redelivered: list[int] = []
        self.runs: list[tuple[Any, ...]] = []
        self.rows = 0
        self.data_len = 0
        self.last_tag = 0
        # decode(): (first row, exchange, routing key, properties, the run's index or -1, offset found)
        self.decoded: list[tuple[int, str, str, list[Any], int, int | None]] = []
        self.decoded_rows = 0
        self.missing = 0  # decoded rows without an offset

    def scan(self, buf: bytes | bytearray, channel: int, pos: int = 0,
             max_rows: int = sys.maxsize) -> tuple[int, int, int]:
        """Append buf's whole deliveries from pos on: (added, pos after them, stop)."""
        added, self.data_len, last_tag, pos, stop = scan_columns(
            buf, channel, pos, max_rows, (self.offsets, self.ends, self.data, self.redelivered, self.runs),
            self.rows, self.data_len)
        if added:
            self.rows += added
            self.last_tag = last_tag
        return added, pos, stop

    def append(self, tag: int, offset: int | None, exchange: str, routing_key: str, properties: list[Any],
               body: bytes, redelivered: bool) -> None:
        """One delivery of the generic frame path, decoded."""
        row = self.rows
        runs = self.runs
        last = runs[-1] if runs else None
        if (last is None or last[4] is not None or last[1] != exchange or last[2] != routing_key
                or last[3] != properties):
            runs.append((row, exchange, routing_key, properties, None))
        _reserve(self.offsets, 8 * (row + 1))
        _reserve(self.ends, 4 * (row + 2))
        _reserve(self.data, self.data_len + len(body))
        _Q_LE.pack_into(self.offsets, 8 * row, NO_OFFSET if offset is None else offset)
        self.data[self.data_len:self.data_len + len(body)] = body
        self.data_len += len(body)
        _I_LE.pack_into(self.ends, 4 * (row + 1), self.data_len)
        if redelivered:
            self.redelivered.append(row)
        self.rows = row + 1
        self.last_tag = tag

    def decode(self) -> None:
        """Decode the runs of the rows appended since the last call into ``decoded``: the names, and the
        properties without the x-stream-offset header, once a run. A row without a stamped offset gets
        the one its block holds, if any.

        A scan run's stamped value is trusted once the decode of its block proves those bytes are the
        headers' x-stream-offset (stamped_properties); otherwise (a nested table that ends with the same
        bytes) each row's own block is decoded."""
        start = self.decoded_rows
        if start >= self.rows:
            return
        runs, decoded = self.runs, self.decoded
        i = len(runs) - 1
        while runs[i][0] > start:
            i -= 1
        for k in range(i, len(runs)):
            first, exchange, routing_key, block, at = runs[k]
            lo = max(first, start)
            hi = runs[k + 1][0] if k + 1 < len(runs) else self.rows
            if at is None:  # decoded by the generic path
                offsets = self.offset_values
                self.missing += sum(1 for row in range(lo, hi) if offsets[row] == NO_OFFSET)
                decoded.append((lo, exchange, routing_key, block, k, None))
                continue
            if decoded and decoded[-1][4] == k:  # more rows of a run decoded before
                self._fill_offsets(lo, hi, decoded[-1][5], at)
                continue
            names = exchange.decode(errors="replace"), routing_key.decode(errors="replace")
            if at >= 0:
                stamped = stamped_properties(block, at)
                offset, props = None, stamped
            else:
                offset, props = offset_and_properties(block)
            if props is None:
                offsets = self.offset_values
                for row in range(lo, hi):
                    own = block[:at] + offsets[row].to_bytes(8, "big", signed=True) + block[at + 8:]
                    offset, own_props = offset_and_properties(own)
                    self.set_offset(row, offset)
                    self.missing += offset is None
                    decoded.append((row, *names, own_props, -1, None))
                continue
            decoded.append((lo, *names, props, k, offset))
            self._fill_offsets(lo, hi, offset, at)
        self.decoded_rows = self.rows

    def _fill_offsets(self, lo: int, hi: int, found: int | None, at: int) -> None:
        """Rows of a run without a stamped value get the offset its block holds (or count as missing)."""
        if at >= 0:
            return
        if found is None:
            self.missing += hi - lo
        else:
            for row in range(lo, hi):
                self.set_offset(row, found)

    @property
    def offset_values(self) -> Sequence[int]:
        """The offsets column (NO_OFFSET where a delivery has none), indexable (for bisect)."""
        return _Int64s(self.offsets, self.rows)

    def set_offset(self, row: int, offset: int | None) -> None:
        _Q_LE.pack_into(self.offsets, 8 * row, NO_OFFSET if offset is None else offset)

    def body(self, row: int) -> bytes:
        lo, hi = struct.unpack_from("<ii", self.ends, 4 * row)
        return bytes(self.data[lo:hi])

    def decoded_spans(self) -> Iterator[tuple[int, int, str, str, list[Any]]]:
        """(first row, row after the last, exchange, routing key, properties) of the decoded rows."""
        decoded = self.decoded
        for i, (first, exchange, routing_key, props, _run, _offset) in enumerate(decoded):
            yield first, decoded[i + 1][0] if i + 1 < len(decoded) else self.decoded_rows, exchange, routing_key, props

    def deliveries(self) -> Iterator[tuple[int | None, str, str, list[Any], bytes]]:
        """The decoded rows one by one: (offset or None, exchange, routing key, properties, body)."""
        offsets = self.offset_values
        for lo, hi, exchange, routing_key, props in self.decoded_spans():
            for row in range(lo, hi):
                offset = offsets[row]
                yield None if offset == NO_OFFSET else offset, exchange, routing_key, props, self.body(row)


class _Int64s(Sequence[int]):
    """The first n little-endian int64s of a buffer as a read-only sequence (bisect's)."""

    __slots__ = ("buf", "n")

    def __init__(self, buf: bytearray, n: int) -> None:
        self.buf = buf
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.n))]
        if index < 0:
            index += self.n
        if not 0 <= index < self.n:
            raise IndexError("offset index out of range")
        return _Q_LE.unpack_from(self.buf, 8 * index)[0]


def split_offset(props: list[Any]) -> int | None:
    """Take x-stream-offset out of the headers (it becomes the offset column)."""
    headers = props[2]
    if not headers:
        return None
    offset = headers.pop(OFFSET_HEADER, None)
    if not headers:
        props[2] = None
    return offset if isinstance(offset, int) else None


OFFSET_HEADER = "x-stream-offset"
# A stream's deliveries differ only in the stamped value, so each distinct rest of a block is decoded
# once and its property list shared by the deliveries that carry it (read-only for its users).
_decoded_blocks: dict[tuple[int, bytes], list[Any]] = {}
_DECODED_MAX = 256


# A queue's deliveries mostly carry one block (a run a scan), which a batch read's every receive
# decoded again into a new list; kept, the list is the same object in the next batch too, whose
# constant columns are then the last batch's (BatchBuilder). Read-only for its users, as above.
_unstamped_blocks: dict[bytes, tuple[int | None, list[Any]]] = {}


def offset_and_properties(block: bytes) -> tuple[int | None, list[Any]]:
    """(x-stream-offset, properties without it) of a delivery's property block."""
    at = block.find(STREAM_OFFSET_ENTRY)
    if at >= 0:
        value = at + len(STREAM_OFFSET_ENTRY)
        props = stamped_properties(block, value)
        if props is not None:
            return int.from_bytes(block[value:value + 8], "big", signed=True), props
    key = block if type(block) is bytes else bytes(block)
    kept = _unstamped_blocks.get(key)
    if kept is not None:
        return kept
    props = property_values(block, typed=False)
    found = split_offset(props), props
    if len(_unstamped_blocks) >= _DECODED_MAX:
        _unstamped_blocks.clear()
    _unstamped_blocks[key] = found
    return found


def stamped_properties(block: bytes, at: int) -> list[Any] | None:
    """The properties (without x-stream-offset) of a block whose 8 bytes at ``at`` are the value of its
    headers' x-stream-offset, or None when they are something else (a nested table or a string that
    ends with the same bytes). Proved by decoding: with those bytes changed, the header's value must
    change with them and nothing else may. Kept by the block's other bytes: a stream's deliveries
    differ only in those, so each distinct rest is decoded twice once."""
    key = (at, block[:at] + block[at + 8:])
    cached = _decoded_blocks.get(key)
    if cached is not None:
        return cached
    value = int.from_bytes(block[at:at + 8], "big", signed=True)
    props = property_values(block, typed=False)
    if split_offset(props) != value:
        return None
    other = value ^ 1
    probe = property_values(block[:at] + other.to_bytes(8, "big", signed=True) + block[at + 8:], typed=False)
    if split_offset(probe) != other or probe != props:
        return None
    if len(_decoded_blocks) >= _DECODED_MAX:
        _decoded_blocks.clear()
    _decoded_blocks[key] = props
    return props
