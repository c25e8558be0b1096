"""The field-table codec: round trips, the nesting limit, and arbitrary bytes."""

from __future__ import annotations

import datetime
import struct
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lavinpy.wire import field_table as ft

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_LEAVES = st.one_of(
    st.booleans(),
    st.integers(-128, 127).map(ft.Int8), st.integers(0, 255).map(ft.UInt8),
    st.integers(-(1 << 15), (1 << 15) - 1).map(ft.Int16), st.integers(0, (1 << 16) - 1).map(ft.UInt16),
    st.integers(-(1 << 31), (1 << 31) - 1).map(ft.Int32), st.integers(0, (1 << 32) - 1).map(ft.UInt32),
    st.integers(-(1 << 63), (1 << 63) - 1).map(ft.Int64), st.integers(0, (1 << 64) - 1).map(ft.UInt64),
    st.floats(width=32).map(ft.Float32), st.floats(allow_nan=False),
    st.builds(lambda v, s: Decimal(v).scaleb(-s), st.integers(-(1 << 31), (1 << 31) - 1), st.integers(0, 255)),
    st.text(max_size=10), st.binary(max_size=10).map(ft.RawLongStr), st.binary(max_size=10),
    st.integers(0, (1 << 64) - 1).map(ft.Timestamp), st.none(),
)
_KEYS = st.binary(max_size=8).map(lambda b: b.decode("utf-8", "surrogateescape"))
_VALUES = st.recursive(_LEAVES, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(_KEYS, inner, max_size=4)), max_leaves=16)


def decode(encoded: bytes, typed: bool = True) -> dict:
    return ft.decode_table(encoded, 4, len(encoded), typed=typed)


@FUZZ
@given(st.dictionaries(_KEYS, _VALUES, max_size=6))
def test_every_type_round_trips_byte_identical(table: dict) -> None:
    encoded = ft.encode_table(table)
    decoded = decode(encoded)
    assert ft.encode_table(decoded) == encoded
    # Plain values carry no wire types but decode the same bytes without error.
    decode(encoded, typed=False)


def test_wire_letters_are_rabbitmqs() -> None:
    table = {"t": True, "b": ft.Int8(-1), "B": ft.UInt8(255), "s": ft.Int16(-2), "u": ft.UInt16(65535),
             "I": ft.Int32(-3), "i": ft.UInt32(4294967295), "l": ft.Int64(-4), "L": ft.UInt64(2**64 - 1),
             "f": ft.Float32(1.5), "d": 2.5, "D": Decimal("-1.25"), "S": "s", "x": b"\x00", "A": [None],
             "T": datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC), "F": {}, "V": None}
    encoded = ft.encode_table(table)
    pos, letters = 4, []
    for key in table:
        assert encoded[pos + 1:pos + 2].decode() == key
        letters.append(chr(encoded[pos + 2]))
        pos = ft.value_end(encoded, pos + 2, len(encoded))
    assert letters == list(table)
    assert decode(encoded) == table


def test_timestamps_past_datetime_range_stay_integers() -> None:
    encoded = ft.encode_table({"t": ft.Timestamp(2**64 - 1)})
    assert encoded[6:7] == b"T"
    value = decode(encoded)["t"]
    assert value == 2**64 - 1 and isinstance(value, ft.Timestamp)
    assert decode(encoded, typed=False)["t"] == 2**64 - 1


def nested(depth: int) -> bytes:
    value = b"F\x00\x00\x00\x00"
    for _ in range(depth - 1):
        body = b"\x01n" + value
        value = b"F" + struct.pack(">I", len(body)) + body
    return b"\x01n" + value


def test_nesting_limit() -> None:
    at_limit = nested(ft.MAX_DEPTH - 1)  # the top-level table is level 1
    ft.validate_table(at_limit, 0, len(at_limit))
    over = nested(ft.MAX_DEPTH)
    with pytest.raises(ft.FieldTableError) as err:
        ft.validate_table(over, 0, len(over))
    assert err.value.too_deep and "nested deeper than 64 levels" in str(err.value)
    very_deep = nested(5000)  # no RecursionError: refused before anything recurses that far
    with pytest.raises(ft.FieldTableError):
        ft.decode_table(very_deep, 0, len(very_deep))


@FUZZ
@given(st.binary(max_size=200))
def test_arbitrary_bytes_are_refused_or_decode(data: bytes) -> None:
    try:
        table = ft.decode_table(data, 0, len(data))
    except ft.FieldTableError:
        return
    reencoded = ft.encode_table(table)
    assert decode(reencoded) == table or any(v != v for v in _leaves(table))  # NaN != NaN


def _leaves(value: object) -> list:
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    if isinstance(value, list):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


@pytest.mark.parametrize("data, reason", [
    (b"\x01kZ", "unknown field type 0x5a at 'k'"),
    (b"\x01kS\x00\x00\x00\x09ab", "'S' length 9 runs past the end of its container at 'k'"),
    (b"\x01kA\x00\x00\x00\x02I\x00", "'I' value truncated at 'k'[0]"),
    (b"\x05ab", "field name or type truncated"),
])
def test_malformed_tables_name_the_problem(data: bytes, reason: str) -> None:
    with pytest.raises(ft.FieldTableError) as err:
        ft.validate_table(data, 0, len(data))
    assert str(err.value) == reason
    assert not err.value.too_deep


def test_check_nesting_refuses_python_values_deeper_than_a_wire_table_may_be():
    """The management API's JSON arguments and headers are held to validate_table's limit."""
    value: object = 1
    for _ in range(ft.MAX_DEPTH - 1):
        value = {"k": value}
    ft.check_nesting({"top": value})  # the table itself is level 1: MAX_DEPTH levels in all
    with pytest.raises(ft.FieldTableError) as e:
        ft.check_nesting({"top": [value]})
    assert e.value.too_deep and e.value.path[:3] == ["top", 0, "k"]
    ft.check_nesting([[[]]], depth=ft.MAX_DEPTH - 2)
    with pytest.raises(ft.FieldTableError):
        ft.check_nesting([[[]]], depth=ft.MAX_DEPTH - 1)
