"""``peek_header``: one header's value without decoding the table, as the whole decode gives it.

The compiled finder (``_cwire.header_span``) and the pure-Python walk (``properties.header_span``)
give the same spans on any bytes; on well formed tables the value is ``peek_headers(raw).get(name)``.
"""

from __future__ import annotations

import random
import struct
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lavinpy.wire import accel, properties
from lavinpy.wire.field_table import Float32, encode_table
from lavinpy.wire.properties import header_key, header_span, peek_header, peek_headers

NAME = "x-deduplication-header"
keys = st.sampled_from([NAME, "x-cache-ttl", "a", "", "x-deduplication-heade", "x-deduplication-headers", "é"])
values = st.one_of(
    st.text(max_size=70), st.binary(max_size=20), st.booleans(), st.integers(-2**63, 2**63 - 1),
    st.floats(allow_nan=False), st.none(), st.decimals(places=2, min_value=-1000, max_value=1000),
    st.lists(st.integers(0, 5), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(0, 5), max_size=2),
)


def block(table: bytes, content_type: bytes | None, encoding: bytes | None, tail: bool) -> bytes:
    """A property block with this headers table (entries' bytes), optional string fields before it and
    delivery mode + message id after it."""
    flags = 0x2000 | (0x8000 if content_type is not None else 0) | (0x4000 if encoding is not None else 0)
    out = b""
    for field in (content_type, encoding):
        if field is not None:
            out += bytes((len(field),)) + field
    out += struct.pack(">I", len(table)) + table
    if tail:
        flags |= 0x1080
        out += b"\x02\x03abc"
    return flags.to_bytes(2, "big") + out


def comparable(value: object) -> object:
    if isinstance(value, float) and not isinstance(value, Float32):
        return ("float", repr(value))
    if isinstance(value, Decimal):
        return ("decimal", str(value))
    return (type(value).__name__, value)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(keys, values), max_size=5), st.one_of(st.none(), st.binary(max_size=5)),
       st.one_of(st.none(), st.binary(max_size=5)), st.booleans(), keys)
def test_the_value_is_the_whole_decodes(entries: list, content_type: bytes | None, encoding: bytes | None,
                                        tail: bool, name: str) -> None:
    # Repeated keys included (the last one counts, as in the decoded dict).
    table = b"".join(encode_table({key: value})[4:] for key, value in entries)
    raw = block(table, content_type, encoding, tail)
    whole = peek_headers(raw)
    assert comparable(peek_header(raw, name)) == comparable(whole.get(name) if whole else None)
    span = header_span(raw, name.encode())
    assert span is not None and bool(span) == (bool(whole) and name in whole)


def test_a_block_without_headers_has_none() -> None:
    assert peek_header(b"\x10\x00\x02", NAME) is None
    assert header_span(b"\x10\x00\x02", NAME.encode()) == ()


def test_a_continuation_word_is_left_to_the_whole_decode() -> None:
    raw = b"\x20\x01\x00\x00" + encode_table({NAME: "id-1"})
    assert header_span(raw, NAME.encode()) is None
    assert peek_header(raw, NAME) == "id-1"


def test_the_last_of_a_repeated_key_counts() -> None:
    raw = block(encode_table({NAME: "first"})[4:] + encode_table({NAME: "second"})[4:], None, None, False)
    assert peek_header(raw, NAME) == "second" == peek_headers(raw)[NAME]


@pytest.mark.skipif(not accel.COMPILED, reason="the pure-Python codec is selected")
@settings(max_examples=500, deadline=None)
@given(st.one_of(st.binary(max_size=40),
                 st.builds(lambda t, ct, enc, tail: block(t, ct, enc, tail),
                           st.binary(max_size=40), st.one_of(st.none(), st.binary(max_size=3)),
                           st.one_of(st.none(), st.binary(max_size=3)), st.booleans()),
                 st.builds(lambda entries, junk: block(b"".join(encode_table({k: v})[4:] for k, v in entries) + junk,
                                                       None, None, False),
                           st.lists(st.tuples(keys, values), max_size=3), st.binary(max_size=4))),
       keys)
def test_compiled_and_pure_spans_agree(raw: bytes, name: str) -> None:
    assert accel.cwire is not None
    assert accel.cwire.header_span(raw, name.encode()) == header_span(raw, name.encode())
    for limit in (0, 3, 64):
        assert accel.cwire.header_key(raw, name.encode(), limit) == header_key(raw, name.encode(), limit)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(keys, values), max_size=4), st.integers(0, 80))
def test_a_key_is_the_short_ascii_string_value_else_the_span(entries: list, limit: int) -> None:
    """``header_key`` (the one used: compiled or pure) gives a short ASCII string value itself, and
    for anything else exactly what ``header_span`` gives."""
    raw = block(b"".join(encode_table({key: value})[4:] for key, value in entries), None, None, False)
    whole = peek_headers(raw) or {}
    value = whole.get(NAME)
    got = properties.find_header_key(raw, NAME.encode(), limit)
    if isinstance(value, str) and value.isascii() and len(value) < limit:
        assert type(got) is str and got == value
    else:
        assert got == header_span(raw, NAME.encode())


def test_the_compiled_finder_is_the_one_used_when_built() -> None:
    expected = accel.cwire.header_span if accel.cwire is not None else header_span
    assert properties._header_span is expected
    assert properties.find_header_key is (accel.cwire.header_key if accel.cwire is not None else header_key)


def _run_blocks(rng: random.Random) -> list[bytes]:
    """Property blocks as a run's messages bring them: with and without headers (identifiers, CC in a
    value), persistent or not, an expiration, a delivery mode after a content type, a continuation word."""
    from lavinpy.wire.properties import encode_property_values
    forms: list[bytes] = [
        encode_property_values(delivery_mode=2), encode_property_values(delivery_mode=1), encode_property_values(),
        encode_property_values(delivery_mode=2, headers={"x-deduplication-header": "id"}),
        encode_property_values(delivery_mode=2, headers={"k": "xCCx"}),
        encode_property_values(delivery_mode=2, headers={"Ck": "aCbC"}),  # C alone, and as the last byte
        encode_property_values(headers={"k": "C"}), encode_property_values(delivery_mode=2, headers={"k": "CxCC"}),
        encode_property_values(headers={"k": 1}),
        encode_property_values(delivery_mode=2, expiration="5"),
        encode_property_values(delivery_mode=2, content_type="text/plain"),
        b"\x10\x01\x00\x00\x02", b"\x10",
    ]
    return [rng.choice(forms) for _ in range(rng.randint(1, 6))]


@pytest.mark.skipif(accel.cwire is None, reason="the compiled extension is not in use")
@pytest.mark.parametrize("seed", range(300))
def test_compiled_and_pure_run_checks_agree(seed: int) -> None:
    """The compiled run check answers as the pure one, or leaves the run to it (-2)."""
    assert accel.cwire is not None
    blocks = _run_blocks(random.Random(seed))
    try:
        expected: object = properties.varied_run_kind(blocks)
    except Exception as e:  # noqa: BLE001 - a malformed block: the compiled check must leave it
        expected = type(e)
    answer = accel.cwire.varied_run_kind(blocks)
    assert answer in (expected, -2)
    if all(block[:2] in (b"\x10\x00", b"\x00\x00", b"\x30\x00", b"\x20\x00") for block in blocks):
        assert answer == expected  # the usual forms are answered in C


def test_a_run_check_answers_what_the_blocks_say() -> None:
    from lavinpy.wire.properties import encode_property_values, varied_run_kind
    plain, with_id = encode_property_values(delivery_mode=2), encode_property_values(
        delivery_mode=2, headers={"x-deduplication-header": "id"})
    assert varied_run_kind([plain, plain]) == 0
    assert varied_run_kind([plain, with_id]) == 1
    assert varied_run_kind([plain, encode_property_values(delivery_mode=1)]) == -1
    assert varied_run_kind([with_id, encode_property_values(delivery_mode=2, expiration="5")]) == -1
    assert varied_run_kind([encode_property_values(delivery_mode=2, headers={"CC": ["q"]})]) == -1
