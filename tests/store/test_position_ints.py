"""Positions (offset << 32 | segment) converted from Python ints by the store's compiled code read an int of up
to three 30-bit digits in place (``cstore_position``): the values and errors must be those of the general
conversion, ``array("Q", ...)``'s, at every digit count and at the limits of [0, 2**64). ``positions_array``
(a queue's run of acks) on both paths; the ready list and the position set, which take single positions
through the same conversion, on the compiled path."""

from __future__ import annotations

import random
from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lavinpy.store.accel import cstore
from lavinpy.store.index_files import positions_array, py_positions_array
from lavinpy.wire.position import make_pos

# 0, one digit, two digits (every record past offset 0), three digits (offsets from 2**28 on), the limits
EDGES = [0, 1, (1 << 30) - 1, 1 << 30, (1 << 32) + 7, (1 << 60) - 1, 1 << 60, (1 << 62) + 5, (1 << 64) - 1,
         make_pos(0xFFFFFFFF, 0xFFFFFFFF), make_pos(3, 4), make_pos(1, 1 << 28)]
BAD = [-1, -(1 << 40), -(1 << 70), 1 << 64, (1 << 64) + 1, 1 << 90, 1 << 200, "x", 1.5, None, b"\x01"]


class Index:
    """Not an int, but an integer through __index__ (as the array takes it)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


class BigInt(int):
    """An int subclass (not an exact int: the general conversion)."""


def _outcome(fn, positions: list) -> object:  # type: ignore[no-untyped-def]
    try:
        return fn(positions)
    except (TypeError, OverflowError) as exc:
        return type(exc), str(exc)


def test_edge_positions_pack_as_the_array_holds_them() -> None:
    got = positions_array(EDGES)
    assert type(got) is array and got.typecode == "Q"
    assert got == array("Q", EDGES)
    assert got.tolist() == EDGES


@given(st.lists(st.one_of(st.integers(0, (1 << 64) - 1), st.sampled_from(EDGES),
                          st.builds(make_pos, st.integers(0, 0xFFFFFFFF), st.integers(0, 0xFFFFFFFF))),
                max_size=300))
def test_any_positions_pack_as_the_array_holds_them(positions: list[int]) -> None:
    assert positions_array(positions) == array("Q", positions)


@pytest.mark.parametrize("bad", BAD, ids=repr)
@pytest.mark.parametrize("at", [0, 5])
def test_what_is_no_position_fails_as_the_array_fails(bad: object, at: int) -> None:
    positions = [*EDGES[:at], bad, *EDGES]
    assert _outcome(positions_array, positions) == _outcome(py_positions_array, positions)
    assert isinstance(_outcome(positions_array, positions), tuple)


def test_int_subclasses_bools_and_index_objects_pack_as_the_array_takes_them() -> None:
    positions = [True, False, BigInt((1 << 63) + 9), BigInt(12), Index(1 << 61), Index(3)]
    assert positions_array(positions) == array("Q", positions)
    for bad in ([Index(-1)], [Index(1 << 64)], [BigInt(-3)], [BigInt(1 << 64)]):
        assert _outcome(positions_array, bad) == _outcome(py_positions_array, bad)


needs_compiled = pytest.mark.skipif(cstore is None, reason="the compiled store is not built (or not selected)")


@needs_compiled
def test_the_compiled_pack_is_the_one_selected() -> None:
    assert positions_array is not py_positions_array


@needs_compiled
def test_the_ready_list_takes_each_digit_count_and_refuses_what_the_array_refuses() -> None:
    assert cstore is not None
    ready = cstore.ReadyList()
    rng = random.Random(7)
    values = EDGES + [rng.randrange(1 << 64) for _ in range(200)] + [BigInt(1 << 61)]
    for value in values:
        ready.push(value)
    assert ready.shift_many(len(values)) == [int(v) for v in values]
    for bad in BAD:
        failure = _outcome(py_positions_array, [bad])
        assert isinstance(failure, tuple)
        with pytest.raises(failure[0]):
            ready.push(bad)


@needs_compiled
def test_the_position_set_finds_each_digit_count_and_none_beyond_the_range() -> None:
    assert cstore is not None
    got = cstore.PositionSet()
    values = EDGES[1:] + [make_pos(s, o) for s in (1, 2, 0xFFFF) for o in (4, 1 << 20, 1 << 28, 1 << 31)]
    for value in values:
        got.add(value)
    assert all(v in got for v in values)
    assert all(v not in got for v in (0, 2, (1 << 64) - 2, 1 << 64, -1, 1 << 90))
    assert sorted(got) == sorted(set(values))
