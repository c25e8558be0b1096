"""The Spark read's offset column helpers: the compiled int64_bounds and pack_int64s agree with their
pure-Python twins (and with max/min and struct) on ints, bools, out-of-range ints and non-ints; and a
chunk is kept to its range the same way whichever bounds a chunk's offsets have."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lavinpy.spark.streams import DeliveryChunk, _in_range
from lavinpy.wire import accel, client

pytestmark = pytest.mark.both_paths

items = st.lists(st.one_of(st.integers(-2**63, 2**63 - 1), st.integers(-2**63, 2**63 - 1),
                           st.sampled_from([2**63, -2**63 - 1, 2**70, None, 1.0, "1", True, False])), max_size=30)


def outcome(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - the twins must fail alike, too
        return type(exc)


@given(items)
def test_int64_bounds_agree(values: list[Any]) -> None:
    expected = client._int64_bounds(values)
    if accel.cclient is not None:
        assert outcome(accel.cclient.int64_bounds, values) == expected
    assert client.int64_bounds(values) == expected
    ints = values and all(isinstance(v, int) and -2**63 <= v < 2**63 for v in values)
    assert expected == ((min(values), max(values)) if ints else None)


@given(items)
def test_pack_int64s_agree(values: list[Any]) -> None:
    expected = client._pack_int64s(values)
    if accel.cclient is not None:
        assert outcome(accel.cclient.pack_int64s, values) == expected
    assert client.pack_int64s(values) == expected
    ints = all(isinstance(v, int) and -2**63 <= v < 2**63 for v in values)
    assert expected == (struct.pack(f"<{len(values)}q", *values) if ints else None)


def old_in_range(offsets: list[int], start: int, end: int) -> tuple[list[int], bool]:
    """The range kept by two passes (max, then min), as the read did before one pass gave both."""
    done = False
    if max(offsets) >= end - 1:
        cut = next(i for i, offset in enumerate(offsets) if offset >= end - 1)
        offsets = offsets[:cut + 1 if offsets[cut] == end - 1 else cut]
        done = True
    if offsets and min(offsets) < start:
        offsets = [offset for offset in offsets if offset >= start]
    return offsets, done


@given(st.lists(st.integers(-5, 40), min_size=1, max_size=20), st.integers(-5, 40), st.integers(-5, 40))
def test_in_range_keeps_what_two_passes_kept(offsets: list[int], start: int, end: int) -> None:
    n = len(offsets)
    chunk = DeliveryChunk(offsets, ["e"] * n, [f"k{i}" for i in range(n)], [[None] * 13] * n,
                          [b"%d" % i for i in range(n)])
    kept, done = _in_range(chunk, start, end)
    expected, expected_done = old_in_range(offsets, start, end)
    assert (kept.offsets, done) == (expected, expected_done)
    positions = [chunk.routing_keys.index(k) for k in kept.routing_keys]
    assert [offsets[i] for i in positions] == kept.offsets
    assert kept.bodies == [b"%d" % i for i in positions]
