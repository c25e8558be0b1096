"""A read's bodies without a bytes object a delivery: the scan's joined bodies (compiled and pure) are the
list scan's bodies; JoinedBodies reads, slices and cuts like that list; join_bodies (compiled and pure)
gives an Arrow binary array equal to the bodies in order, whatever mix of joined parts, slices of them
and plain lists a batch holds; and a batch built from joined chunks equals one built from lists."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lavinpy.spark.read_rows import COLUMNS, BatchBuilder
from lavinpy.spark.streams import DeliveryChunk, _chunk, _in_range
from lavinpy.wire import accel, client, joined_bodies, writer
from lavinpy.wire.client import STREAM_OFFSET_ENTRY
from lavinpy.wire.joined_bodies import JoinedBodies
from lavinpy.wire.properties import append_header_entry

pytestmark = pytest.mark.both_paths

bodies_lists = st.lists(st.binary(max_size=40), max_size=25)


def deliveries(bodies: list[bytes], first: int = 100, redelivered: tuple[int, ...] = ()) -> bytes:
    """A stream's deliveries of these bodies on channel 1 (an empty body has no body frame)."""
    out = bytearray()
    for i, body in enumerate(bodies):
        props = append_header_entry(b"\x00\x00", STREAM_OFFSET_ENTRY + (first + i).to_bytes(8, "big", signed=True))
        out += b"".join(writer.deliver(1, "ctag", i + 1, i in redelivered, "ex", "rk", props, body, 131072))
    return bytes(out)


def scans() -> list[Any]:
    found = [client._scan_stream_deliveries]
    if accel.cclient is not None:
        found.append(accel.cclient.scan_stream_deliveries)
    return found


def joins() -> list[Any]:
    found = [joined_bodies._join_bodies]
    if accel.cclient is not None:
        found.append(lambda parts: accel.cclient.join_bodies(
            [(p.data, p.ends, p.start, p.stop) if type(p) is JoinedBodies else p for p in parts]))
    return found


@given(bodies_lists, st.integers(0, 60), st.sets(st.integers(0, 24), max_size=4))
def test_the_joined_scan_gives_the_list_scans_bodies(bodies: list[bytes], cut: int, again: set[int]) -> None:
    data = deliveries(bodies, redelivered=tuple(again))
    data = data[:len(data) - cut] if cut < len(data) else data  # a partial delivery at the end, too
    for scan in scans():
        flags_list: list[int] = []
        flags_joined: list[int] = []
        listed = scan(data, 1, 0, flags_list)
        joined = scan(data, 1, 0, flags_joined, True)
        assert joined[:4] == listed[:4] and joined[5:] == listed[5:]
        assert flags_joined == flags_list
        data_bytes, ends = joined[4]
        assert type(data_bytes) is bytes and type(ends) is bytes
        assert list(JoinedBodies(data_bytes, ends)) == listed[4]
        assert ends[:4] == b"\x00\x00\x00\x00" and len(ends) == 4 * (len(listed[4]) + 1)
    if accel.cclient is not None:  # the twins agree on the buffers themselves
        assert accel.cclient.scan_stream_deliveries(data, 1, 0, None, True) == \
            client._scan_stream_deliveries(data, 1, 0, None, True)


@given(bodies_lists, st.integers(-30, 30), st.integers(-30, 30), st.integers(-30, 30))
def test_joined_bodies_read_and_slice_as_the_list(bodies: list[bytes], i: int, lo: int, hi: int) -> None:
    joined = JoinedBodies.of_scan(client._scan_stream_deliveries(deliveries(bodies), 1, joined=True)[4])
    assert len(joined) == len(bodies) and joined == bodies and list(joined) == bodies
    if -len(bodies) <= i < len(bodies):
        assert joined[i] == bodies[i]
    else:
        with pytest.raises(IndexError):
            joined[i]
    part = joined[lo:hi]
    assert list(part) == bodies[lo:hi] and len(part) == len(bodies[lo:hi])
    assert list(part[1:]) == bodies[lo:hi][1:]
    assert joined[::2] == bodies[::2]


@settings(max_examples=60)
@given(st.lists(st.tuples(bodies_lists, st.integers(0, 25), st.integers(0, 25), st.booleans()), max_size=6))
def test_join_bodies_gives_the_bodies_in_order(parts_spec: list[tuple[list[bytes], int, int, bool]]) -> None:
    parts: list[Any] = []
    expected: list[bytes] = []
    for bodies, lo, hi, as_list in parts_spec:
        if as_list:
            parts.append(list(bodies[lo:hi]))
        else:
            scanned = client._scan_stream_deliveries(deliveries(bodies), 1, joined=True)
            parts.append(JoinedBodies.of_scan(scanned[4])[lo:hi])
        expected.extend(bodies[lo:hi])
    results = [join(parts) for join in joins()]
    assert all(result == results[0] for result in results)
    ends, data = results[0]
    array = pa.Array.from_buffers(pa.binary(), len(expected), [None, pa.py_buffer(ends), pa.py_buffer(data)])
    array.validate(full=True)
    assert array.to_pylist() == expected
    assert joined_bodies.join_bodies(parts) == results[0]


def test_join_bodies_refuses_what_is_not_bodies() -> None:
    joined = JoinedBodies.of_scan(client._scan_stream_deliveries(deliveries([b"ab", b"c"]), 1, joined=True)[4])
    for join in joins():
        assert join([[b"a", "b"]]) is None
        assert join([joined, (b"x",)]) is None
    if accel.cclient is not None:  # rows outside the buffers
        assert accel.cclient.join_bodies([(joined.data, joined.ends, 0, 3)]) is None
        assert accel.cclient.join_bodies([(joined.data, b"\x00\x00\x00\x00\x09\x00\x00\x00", 0, 1)]) is None


@settings(max_examples=30)
@given(st.lists(bodies_lists.filter(bool), min_size=1, max_size=5), st.integers(0, 10), st.integers(1, 40))
def test_a_batch_of_joined_chunks_is_the_batch_of_lists(chunks: list[list[bytes]], skip: int, batch_rows: int) -> None:
    schema = pa.schema([("offset", pa.int64()), ("body", pa.binary()), ("routing_key", pa.string())])
    assert set(schema.names) <= set(COLUMNS)
    first = 100
    joined_chunks: list[DeliveryChunk] = []
    list_chunks: list[DeliveryChunk] = []
    at = first
    for bodies in chunks:
        columns = client.scan_stream_deliveries(deliveries(bodies, at), 1, joined=True)
        joined_chunks.append(_in_range(_chunk(*columns[:4], JoinedBodies.of_scan(columns[4])), first + skip, 10**6)[0])
        listed = client.scan_stream_deliveries(deliveries(bodies, at), 1)
        list_chunks.append(_in_range(_chunk(*listed[:5]), first + skip, 10**6)[0])
        at += len(bodies)
    joined_chunks = [chunk for chunk in joined_chunks if chunk.offsets]
    list_chunks = [chunk for chunk in list_chunks if chunk.offsets]
    built = list(BatchBuilder(schema, batch_rows).chunk_batches(joined_chunks))
    expected = list(BatchBuilder(schema, batch_rows).chunk_batches(list_chunks))
    assert [batch.to_pydict() for batch in built] == [batch.to_pydict() for batch in expected]
    for batch in built:
        batch.validate(full=True)
