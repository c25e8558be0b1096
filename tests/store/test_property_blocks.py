"""A record's property block is found by walking the fields its flags announce (``cstore_properties_end``
steps from one present field to the next): every one of the fourteen fields alone, all of them, any subset,
and continuation flag words decode as the pure reader decodes them, and a block cut short is refused alike."""

from __future__ import annotations

import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands

from lavinpy.store import record

cstore = pytest.importorskip("lavinpy.store._cstore")
cstore.configure(record.StoredMessage, record.CorruptRecord)

EVERY_FIELD = {
    "content_type": "text/plain", "content_encoding": "gzip", "headers": {"a": 1, "bb": "x" * 40},
    "delivery_mode": 2, "priority": 7, "correlation_id": "c-1", "reply_to": "r", "expiration": "60000",
    "message_id": "m" * 200, "timestamp": datetime.datetime(2024, 5, 1, tzinfo=datetime.UTC), "message_type": "t",
    "user_id": "guest", "app_id": "app", "cluster_id": "cl",
}


def _block(fields: dict) -> bytes:
    """The property block of ``fields`` (cluster_id, which pamqp will not write, set by hand: the last field)."""
    fields = dict(fields)
    cluster = fields.pop("cluster_id", None)
    raw = commands.Basic.Properties(**fields).marshal()
    if cluster is None:
        return raw
    flags = int.from_bytes(raw[:2], "big") | 0x0004
    return flags.to_bytes(2, "big") + raw[2:] + bytes([len(cluster)]) + cluster.encode()


def _record(props: bytes, body: bytes = b"body") -> bytearray:
    names = record.encode_names(b"ex", b"rk")
    buf = bytearray(record.record_size(b"ex", b"rk", props, len(body)))
    record.py_write_encoded(buf, 0, names, props, body, 1234)
    return buf


def _decoded(read, buf: bytearray) -> object:  # type: ignore[no-untyped-def]
    try:
        return read(buf, 0, len(buf))
    except record.CorruptRecord as exc:
        return "corrupt", str(exc).split(":")[0]


def _agree(props: bytes) -> None:
    buf = _record(props)
    got = _decoded(cstore.read_record, buf)
    assert got == _decoded(record.py_read_record, buf)
    assert not isinstance(got, tuple) or got[0] == "corrupt" or got[0].properties == props  # type: ignore[union-attr]


@pytest.mark.parametrize("name", sorted(EVERY_FIELD))
def test_each_field_alone_decodes_as_the_pure_reader_decodes_it(name: str) -> None:
    props = _block({name: EVERY_FIELD[name]})
    buf = _record(props)
    message, _ = cstore.read_record(buf, 0, len(buf))
    assert message.properties == props and message.body == b"body"
    _agree(props)


def test_every_field_at_once_decodes_as_the_pure_reader_decodes_it() -> None:
    props = _block(EVERY_FIELD)
    buf = _record(props)
    message, _ = cstore.read_record(buf, 0, len(buf))
    assert message.properties == props
    _agree(props)


@given(st.sets(st.sampled_from(sorted(EVERY_FIELD))))
def test_any_subset_of_fields_decodes_as_the_pure_reader_decodes_it(names: set[str]) -> None:
    _agree(_block({n: EVERY_FIELD[n] for n in names}))


def test_continuation_flag_words_are_stepped_over() -> None:
    # flags with the continuation bit, then a second word (no further fields announced), then the fields
    props = (0x9001).to_bytes(2, "big") + (0).to_bytes(2, "big") + b"\x0atext/plain" + b"\x02"
    buf = _record(props)
    message, _ = cstore.read_record(buf, 0, len(buf))
    assert message.properties == props
    _agree(props)


@pytest.mark.parametrize("cut", [1, 2, 5, 20])
def test_a_block_cut_short_is_refused_as_the_pure_reader_refuses_it(cut: int) -> None:
    whole = _block(EVERY_FIELD)
    _agree(whole[:-cut])
