"""Raw property blocks: length walking, peeks and edits checked against pamqp for every field."""

from __future__ import annotations

import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands

from lavinpy.wire.properties import (
    FIELDS,
    PropertiesError,
    decode_properties,
    encode_properties,
    peek_delivery_mode,
    peek_expiration,
    peek_headers,
    peek_priority,
    peek_timestamp,
    properties_end,
    properties_length,
    replace_field,
    replace_headers,
)

# FIELDS uses the AMQP name "type"; pamqp calls it "message_type".
PAMQP_NAME = {name: ("message_type" if name == "type" else name) for name, _bit, _kind in FIELDS}

short_text = st.text(min_size=1, max_size=40).filter(lambda s: len(s.encode()) <= 255)
table_keys = st.text(min_size=1, max_size=20)
table_values = st.recursive(
    st.one_of(st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=30),
              st.floats(width=32, allow_nan=False)),  # pamqp encodes floats as 32-bit
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(table_keys, inner, max_size=3)),
    max_leaves=8,
)
timestamps = st.integers(0, 2**32 - 1).map(lambda s: datetime.datetime.fromtimestamp(s, tz=datetime.UTC))

FIELD_VALUES = {
    "content_type": short_text, "content_encoding": short_text,
    "headers": st.dictionaries(table_keys, table_values, min_size=1, max_size=4),
    "delivery_mode": st.integers(1, 2), "priority": st.integers(0, 255),
    "correlation_id": short_text, "reply_to": short_text, "expiration": short_text,
    "message_id": short_text, "timestamp": timestamps, "type": short_text, "user_id": short_text,
    "app_id": short_text, "cluster_id": short_text,
}


def make_props(values: dict) -> commands.Basic.Properties:
    props = commands.Basic.Properties()
    for name, value in values.items():
        setattr(props, PAMQP_NAME[name], value)  # setattr skips pamqp's cluster_id check
    return props


property_sets = st.fixed_dictionaries({}, optional=FIELD_VALUES)


def as_dict(props: commands.Basic.Properties) -> dict:
    values = {name: getattr(props, PAMQP_NAME[name]) for name, _bit, _kind in FIELDS}
    if values["cluster_id"] == "":  # pamqp's default for an absent cluster_id
        values["cluster_id"] = None
    return values


def test_properties_length_existing_behaviour():
    assert properties_length(b"\x00\x00") == 2
    assert properties_length(b"xx\x10\x00\x02yy", 2, 5) == 3
    with pytest.raises(PropertiesError):
        properties_length(b"\x80\x00\x05ab")
    with pytest.raises(PropertiesError):
        properties_length(b"\x00")


@settings(max_examples=300, deadline=None)
@given(property_sets)
def test_decode_and_peeks_agree_with_pamqp(values):
    props = make_props(values)
    raw = props.marshal()
    assert encode_properties(props) == raw
    assert properties_length(raw) == len(raw)
    assert properties_end(raw, 0, len(raw)) == len(raw)
    assert properties_end(b"pre" + raw + b"post", 3, 3 + len(raw) + 4) == 3 + len(raw)
    decoded = decode_properties(raw)
    assert as_dict(decoded) == as_dict(props)
    assert peek_delivery_mode(raw) == values.get("delivery_mode")
    assert peek_priority(raw) == values.get("priority")
    assert peek_expiration(raw) == values.get("expiration")
    stamp = values.get("timestamp")
    assert peek_timestamp(raw) == (int(stamp.timestamp()) if stamp is not None else None)
    assert peek_headers(raw) == values.get("headers")
    assert peek_headers(memoryview(raw)) == values.get("headers")


@pytest.mark.parametrize("name", [name for name, _bit, _kind in FIELDS])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_replace_field_sets_and_removes_every_field(name, data):
    values = data.draw(property_sets)
    new_value = data.draw(FIELD_VALUES[name])
    raw = make_props(values).marshal()

    replaced = replace_field(raw, name, new_value)
    expected = dict(as_dict(make_props(values)), **{name: new_value})
    assert as_dict(decode_properties(replaced)) == expected
    assert properties_length(replaced) == len(replaced)

    removed = replace_field(raw, name, None)
    expected[name] = None
    assert as_dict(decode_properties(removed)) == expected
    # Untouched fields keep their exact bytes: removing what was never there is a no-op.
    if name not in values:
        assert removed == raw


def test_replace_field_accepts_pamqp_name_and_int_timestamp():
    raw = replace_field(b"\x00\x00", "message_type", "kind")
    assert decode_properties(raw).message_type == "kind"
    raw = replace_field(raw, "timestamp", 1_700_000_000)
    assert decode_properties(raw).timestamp == datetime.datetime.fromtimestamp(1_700_000_000, tz=datetime.UTC)


def test_replace_headers():
    raw = make_props({"content_type": "a", "headers": {"CC": ["q2"], "k": 1}, "priority": 4}).marshal()
    stripped = replace_headers(raw, {"k": 1})
    assert peek_headers(stripped) == {"k": 1}
    assert peek_priority(stripped) == 4 and decode_properties(stripped).content_type == "a"
    gone = replace_headers(raw, None)
    assert peek_headers(gone) is None and gone == make_props({"content_type": "a", "priority": 4}).marshal()
    empty = replace_headers(raw, {})
    assert peek_headers(empty) == {}


@pytest.mark.parametrize(("name", "value", "error"), [
    ("content_type", "x" * 256, ValueError),
    ("priority", 256, ValueError),
    ("delivery_mode", "2", ValueError),
    ("timestamp", -1, ValueError),
    ("nope", 1, KeyError),
])
def test_replace_field_refuses_bad_values(name, value, error):
    with pytest.raises(error):
        replace_field(b"\x00\x00", name, value)


@pytest.mark.parametrize("raw", [
    b"", b"\x00", b"\x80\x00", b"\x80\x00\x05ab", b"\x20\x00\x00\x00", b"\x20\x00\x00\x00\x00\x09",
    b"\x10\x00", b"\x00\x40\x00\x00", b"\x00\x01",  # continuation flag without the next word
])
def test_truncated_blocks_raise_properties_error(raw):
    with pytest.raises(PropertiesError):
        properties_end(raw, 0, len(raw))
    with pytest.raises(PropertiesError):
        decode_properties(raw)


@pytest.mark.parametrize("peek", [peek_delivery_mode, peek_priority, peek_expiration, peek_headers, peek_timestamp])
def test_peeks_on_truncated_blocks(peek):
    with pytest.raises(PropertiesError):
        peek(b"\xff\xfc")


def test_decode_refuses_trailing_bytes_and_bad_tables():
    with pytest.raises(PropertiesError):
        decode_properties(b"\x00\x00\x00")
    with pytest.raises(PropertiesError):  # unknown field value type "Z" inside headers
        decode_properties(b"\x20\x00\x00\x00\x00\x03\x01kZ")
    with pytest.raises(PropertiesError):
        peek_headers(b"\x20\x00\x00\x00\x00\x03\x01kZ")


def test_expiration_must_be_utf8():
    with pytest.raises(PropertiesError):
        peek_expiration(b"\x01\x00\x02\xff\xfe")


def test_continuation_flag_words_are_skipped():
    # A second flag word (unused by basic) must not shift the fields.
    raw = b"\x10\x01\x00\x00\x02"
    assert properties_length(raw) == len(raw) == properties_end(raw, 0, len(raw))
    assert peek_delivery_mode(raw) == 2
    assert decode_properties(raw).delivery_mode == 2
    assert peek_delivery_mode(replace_field(raw, "delivery_mode", 1)) == 1


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_properties_end_matches_properties_length_on_any_bytes(raw):
    try:
        expected = properties_length(raw)
    except PropertiesError:
        with pytest.raises(PropertiesError):
            properties_end(raw, 0, len(raw))
    else:
        assert properties_end(raw, 0, len(raw)) == expected


def test_delivery_mode_after_headers_is_read_past_the_table():
    # headers then delivery mode, the shape of a message with an identifier: read after the table
    from lavinpy.wire.field_table import encode_table
    raw = b"\x30\x00" + encode_table({"x-deduplication-header": "id"}) + b"\x02"
    assert peek_delivery_mode(raw) == 2
    for cut in range(2, len(raw)):  # a table that runs past the block is an error, not a guess
        with pytest.raises(PropertiesError):
            peek_delivery_mode(raw[:cut])
