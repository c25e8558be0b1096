"""Frames and rows for the tests of a read's delivery columns (test_scan_columns, test_delivery_columns)."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pytest
from hypothesis import strategies as st

from lavinpy.wire import accel, writer
from lavinpy.wire.delivery_columns import (
    STOP_RAN_OUT,
    STREAM_OFFSET_ENTRY,
    DeliveryColumns,
    _scan_columns,
    offset_and_properties,
)
from lavinpy.wire.properties import append_header_entry, encode_property_values, property_values

FRAME_MAX = 4096
MAX_DATA = 0x7FFFFFFF
HEARTBEAT = b"\x08\x00\x00\x00\x00\x00\x00\xce"
needs_compiled = pytest.mark.skipif(accel.cclient is None, reason="the pure-Python path is selected")


def twins() -> list[Any]:
    """The scans to check: the pure one always, the compiled one where it is built."""
    found: list[Any] = [_scan_columns]
    if accel.cclient is not None:
        found.append(accel.cclient.scan_columns)
    return found


def deliver(block: bytes, body: bytes, tag: int = 1, exchange: str = "ex", routing_key: str = "rk",
            redelivered: bool = False, channel: int = 1, frame_max: int = FRAME_MAX) -> bytes:
    """basic.deliver, its content header and body frames, as a broker sends them."""
    return b"".join(writer.deliver(channel, "ctag", tag, redelivered, exchange, routing_key, block, body, frame_max))


def value(offset: int) -> bytes:
    return offset.to_bytes(8, "big", signed=True)


def stamped(block: bytes, offset: int) -> bytes:
    """The block with x-stream-offset appended as its headers' last entry (type 'l'), as a stream stamps it."""
    return append_header_entry(block, STREAM_OFFSET_ENTRY + value(offset))


def empty_columns() -> tuple[bytearray, bytearray, bytearray, list[int], list[Any]]:
    return bytearray(), bytearray(4), bytearray(), [], []


def copy_columns(cols: tuple[Any, ...]) -> tuple[bytearray, bytearray, bytearray, list[int], list[Any]]:
    offsets, ends, data, redelivered, runs = cols
    return bytearray(offsets), bytearray(ends), bytearray(data), list(redelivered), list(runs)


def filled(cols: tuple[Any, ...], rows: int, data_len: int) -> tuple[Any, ...]:
    """What a scan wrote: the columns' filled parts, their capacity, the redelivered rows and the runs."""
    offsets, ends, data, redelivered, runs = cols
    return (bytes(offsets[:8 * rows]), bytes(ends[:4 * (rows + 1)]), bytes(data[:data_len]),
            (len(offsets), len(ends), len(data)), list(redelivered), list(runs))


def offsets_of(cols: tuple[Any, ...], rows: int) -> list[int]:
    return list(struct.unpack_from(f"<{rows}q", cols[0]))


def ends_of(cols: tuple[Any, ...], rows: int) -> list[int]:
    return list(struct.unpack_from(f"<{rows + 1}i", cols[1]))


def outcome(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as err:  # noqa: BLE001 - compared, not handled
        return type(err), str(err)


# --- property blocks --------------------------------------------------------------------------------

BASES = [
    b"\x00\x00",
    encode_property_values(content_type="text/plain", delivery_mode=2),
    encode_property_values(headers={"k": "v"}),
    # fields before and after the headers, headers of several entries
    encode_property_values(content_type="a", content_encoding="gzip", headers={"k": "v", "n": 5}, priority=3,
                           app_id="app", message_id="m", timestamp=1_700_000_000),
    encode_property_values(headers={}),  # an empty table
]


def nested_look_alike(offset: int) -> bytes:
    """Headers {"n": {"x-stream-offset": offset}}: the nested table (and so the headers) ends with the
    stamped entry's bytes, but the headers hold no x-stream-offset of their own."""
    nested = STREAM_OFFSET_ENTRY + value(offset)
    return append_header_entry(b"\x00\x00", b"\x01nF" + struct.pack(">I", len(nested)) + nested)


def string_look_alike(offset: int) -> bytes:
    """Headers {"k": <a long string ending with the stamped entry's bytes>}."""
    text = STREAM_OFFSET_ENTRY + value(offset)
    return append_header_entry(b"\x00\x00", b"\x01kS" + struct.pack(">I", len(text)) + text)


AFTER_OFFSET = 9


def look_alike_after_the_offset(offset: int) -> bytes:
    """A real x-stream-offset (9, type 'I', not last), then a nested table ending like the stamped entry."""
    nested = STREAM_OFFSET_ENTRY + value(offset)
    block = encode_property_values(headers={"x-stream-offset": AFTER_OFFSET})
    return append_header_entry(block, b"\x01nF" + struct.pack(">I", len(nested)) + nested)


def offset_not_last(offset: int) -> bytes:
    """x-stream-offset as the first header (as another broker may order them): found by the decode."""
    return encode_property_values(headers={"x-stream-offset": offset % 1000, "z": "1"})


def offset_last_as_int32(offset: int) -> bytes:
    """x-stream-offset last, but of type 'I': not the stamped entry's bytes, found by the decode."""
    return encode_property_values(app_id="a", headers={"a": "1", "x-stream-offset": offset % 1000})


# Each kind: (the block of a delivery with this offset, whether its headers end with the entry's bytes)
KINDS: list[tuple[Any, bool]] = [
    *((lambda offset, base=base: stamped(base, offset), True) for base in BASES),
    *((lambda offset, base=base: base, False) for base in BASES),
    (nested_look_alike, True),
    (string_look_alike, True),
    (look_alike_after_the_offset, True),
    (offset_not_last, False),
    (offset_last_as_int32, False),
]
STAMPED, PLAIN = 0, len(BASES)  # + the index of a base block
NESTED, STRING, AFTER, NOT_LAST, INT32 = range(2 * len(BASES), len(KINDS))


def own_decode(block: bytes) -> tuple[int | None, list[Any]]:
    """A delivery's offset and properties (x-stream-offset taken out of the headers), decoded on its own."""
    props = property_values(block, typed=False)
    headers = props[2]
    offset = None
    if headers:
        offset = headers.pop("x-stream-offset", None)
        if not headers:
            props[2] = None
    return (offset if isinstance(offset, int) else None), props


@dataclass
class Row:
    exchange: str
    routing_key: str
    block: bytes
    at: int  # where the stamped value's 8 bytes are in the block (the bytes say so), or -1
    body: bytes
    redelivered: bool = False
    generic: bool = False  # appended as the generic frame path hands a delivery over

    def frames(self, tag: int) -> bytes:
        return deliver(self.block, self.body, tag, self.exchange, self.routing_key, self.redelivered)

    def expected(self) -> tuple[int | None, str, str, list[Any], bytes]:
        offset, props = own_decode(self.block)
        assert offset_and_properties(self.block) == (offset, props)
        return offset, self.exchange, self.routing_key, props, self.body

    appended = expected  # what the generic path hands over for it (fill)

    def run_key(self) -> tuple[Any, ...]:
        """What deliveries of one scan run share: all but the stamped value."""
        block = self.block if self.at < 0 else self.block[:self.at] + self.block[self.at + 8:]
        return self.exchange, self.routing_key, self.at, block


def make_row(kind: int, offset: int, exchange: str = "ex", routing_key: str = "rk", body: bytes = b"",
             redelivered: bool = False, generic: bool = False) -> Row:
    make, trailing = KINDS[kind]
    block = make(offset)
    at = block.index(STREAM_OFFSET_ENTRY + value(offset)) + len(STREAM_OFFSET_ENTRY) if trailing else -1
    return Row(exchange, routing_key, block, at, body, redelivered, generic)


def expected_runs(rows: list[Row]) -> list[tuple[Any, ...]]:
    """The runs a scan (and append) should make of rows."""
    runs: list[tuple[Any, ...]] = []
    last_key = None
    for i, row in enumerate(rows):
        if row.generic:
            _offset, exchange, routing_key, props, _body = row.expected()
            if not (runs and runs[-1][4] is None and runs[-1][1:4] == (exchange, routing_key, props)):
                runs.append((i, exchange, routing_key, props, None))
            last_key = None
        elif not (runs and runs[-1][4] is not None and row.run_key() == last_key):
            runs.append((i, row.exchange.encode(), row.routing_key.encode(), row.block, row.at))
            last_key = row.run_key()
    return runs


class FillRow(Protocol):
    """A row fill takes: its frames, or what the generic path hands over for it."""
    generic: bool
    redelivered: bool

    def frames(self, tag: int) -> bytes: ...

    def appended(self) -> tuple[int | None, str, str, list[Any], bytes]: ...


def fill(cols: DeliveryColumns, rows: Sequence[FillRow], data: st.DataObject | None = None) -> None:
    """The rows into cols: the generic ones appended, each stretch of the others scanned from one receive
    buffer (bytes or bytearray) a few rows at a time; decodes between, as a reader makes them."""
    tag = cols.last_tag + 1
    i = 0
    while i < len(rows):
        if rows[i].generic:
            offset, exchange, routing_key, props, body = rows[i].appended()
            cols.append(tag, offset, exchange, routing_key, props, body, rows[i].redelivered)
            tag += 1
            i += 1
        else:
            j = i
            while j < len(rows) and not rows[j].generic:
                j += 1
            frames = [row.frames(tag + k) for k, row in enumerate(rows[i:j])]
            buf: bytes | bytearray = b"".join(frames)
            if data is not None and data.draw(st.booleans(), label="bytearray buffer"):
                buf = bytearray(buf)
            pos = done = 0
            while done < len(frames):
                step = len(frames) - done if data is None else data.draw(st.integers(1, len(frames) - done),
                                                                          label="rows a scan")
                after = pos + sum(map(len, frames[done:done + step]))
                assert cols.scan(buf, 1, pos, step) == (step, after, STOP_RAN_OUT)
                pos, done = after, done + step
            assert cols.scan(buf, 1, pos) == (0, len(buf), STOP_RAN_OUT)
            tag += len(frames)
            i = j
        assert cols.last_tag == tag - 1
        if data is not None and data.draw(st.booleans(), label="decode"):
            cols.decode()


names = st.sampled_from(["", "ex", "rk", "é"])  # exchanges and routing keys (é: two UTF-8 bytes)
