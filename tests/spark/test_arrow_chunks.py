"""A read's chunks with offsets and bodies as Arrow arrays (scan_stream_arrow, ArrowChunk) hold exactly
what the list path (scan_stream_deliveries, _chunk, DeliveryChunk) holds: offsets found at the end of
the headers, elsewhere in them or nowhere, shared and distinct property blocks, empty bodies; and
slicing, joining and keeping a range give what the same operations on lists give."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lavinpy.spark.chunks import ArrowChunk, DeliveryChunk, as_arrow, joined
from lavinpy.spark.streams import _arrow_in_range, _chunk, _in_range, arrow_chunk
from lavinpy.wire import properties, writer
from lavinpy.wire.client import STREAM_OFFSET_ENTRY, scan_stream_arrow, scan_stream_deliveries

pytestmark = pytest.mark.both_paths


def block(kind: str, offset: int) -> bytes:
    if kind == "trailing":  # where a stream stamps it
        return properties.append_header_entry(properties.encode_property_values(app_id="a"),
                                              STREAM_OFFSET_ENTRY + offset.to_bytes(8, "big", signed=True))
    if kind == "elsewhere":  # another broker's order: not the last entry
        return properties.encode_property_values(headers={"x-stream-offset": offset, "z": 1})
    return properties.encode_property_values(delivery_mode=2)  # a queue's: no offset


deliveries = st.lists(st.tuples(st.sampled_from(["trailing", "trailing", "elsewhere", "plain"]),
                                st.integers(-2**40, 2**40), st.binary(max_size=40), st.sampled_from(["", "ex"]),
                                st.sampled_from(["rk", "other"]), st.booleans()), min_size=1, max_size=30)


def receive_buffer(items: list) -> bytes:
    return b"".join(b"".join(writer.deliver(1, "ctag", tag + 1, flag, exchange, key, block(kind, offset), body,
                                            131072))
                    for tag, (kind, offset, body, exchange, key, flag) in enumerate(items))


def arrow_scan(data: bytes, flags: list[int] | None = None) -> tuple[ArrowChunk, tuple]:
    out = pa.allocate_buffer(len(data))
    scanned = scan_stream_arrow(data, 1, out, 0, flags)
    return arrow_chunk(scanned, out), scanned[10:]


@settings(max_examples=150, deadline=None)
@given(deliveries, st.integers(0, 60))
def test_arrow_chunk_holds_what_the_list_chunk_holds(items: list, cut: int) -> None:
    data = receive_buffer(items)
    data = data[:max(0, len(data) - cut)]
    flags: list[int] = []
    list_flags: list[int] = []
    chunk, tail = arrow_scan(data, flags)
    columns = scan_stream_deliveries(data, 1, 0, list_flags)
    assert tail == tuple(columns[5:]) and flags == list_flags
    expected = _chunk(*columns[:5])
    assert chunk.to_lists() == expected
    assert chunk.bodies.type == pa.binary() and (chunk.offsets is None or chunk.offsets.type == pa.int64())
    present = [offset for offset in expected.offsets if offset is not None]
    assert (chunk.offsets is None) == (not present)
    assert (chunk.low, chunk.high) == ((min(present), max(present)) if present else (0, 0))


def list_chunk(offsets: list[int | None]) -> DeliveryChunk:
    n = len(offsets)
    return DeliveryChunk(offsets, ["e"] * n, [f"k{i}" for i in range(n)], [[i] for i in range(n)],  # type: ignore[arg-type]
                         [b"%d" % i * (i % 3) for i in range(n)])


offset_lists = st.one_of(st.lists(st.integers(-50, 50), min_size=1, max_size=20),
                         st.lists(st.none(), min_size=1, max_size=20),
                         st.lists(st.one_of(st.none(), st.integers(-50, 50)), min_size=1, max_size=20))


@given(offset_lists, st.integers(0, 25), st.one_of(st.none(), st.integers(0, 25)))
def test_slice_and_round_trip(offsets: list[int | None], start: int, stop: int | None) -> None:
    chunk = list_chunk(offsets)
    arrow = ArrowChunk.of_lists(chunk)
    assert arrow.to_lists() == chunk
    part = arrow.slice(start, stop)
    expected = DeliveryChunk._make(column[start:stop] for column in chunk)
    assert part.to_lists() == expected
    present = [offset for offset in expected.offsets if offset is not None]
    assert (part.low, part.high) == ((min(present), max(present)) if present else (0, 0))


@given(st.lists(offset_lists, min_size=1, max_size=4))
def test_joined_is_the_lists_concatenated(parts: list[list[int | None]]) -> None:
    chunks = [list_chunk(offsets) for offsets in parts]
    whole = joined([as_arrow(chunk) for chunk in chunks])
    assert whole.to_lists() == DeliveryChunk._make(sum((list(column) for column in columns), [])
                                                   for columns in zip(*chunks, strict=True))
    present = [offset for offsets in parts for offset in offsets if offset is not None]
    if len(chunks) > 1 or present:
        assert (whole.low, whole.high) == ((min(present), max(present)) if present else (0, 0))


@given(st.lists(st.integers(-5, 40), min_size=1, max_size=20), st.integers(-5, 40), st.integers(-5, 40))
def test_arrow_in_range_keeps_what_in_range_keeps(offsets: list[int], start: int, end: int) -> None:
    chunk = list_chunk(offsets)  # type: ignore[arg-type]
    kept, done = _arrow_in_range(ArrowChunk.of_lists(chunk), start, end)
    expected, expected_done = _in_range(chunk, start, end)
    assert (kept.to_lists(), done) == (expected, expected_done)
