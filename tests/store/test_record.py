"""Message records: round trips through a real mmap and detection of damaged bytes."""

from __future__ import annotations

import datetime
import mmap
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands

from lavinpy.store.record import (
    HEADER_SIZE,
    CorruptRecord,
    StoredMessage,
    read_header,
    read_record,
    record_length_at,
    record_size,
    write_record,
)
from lavinpy.wire.properties import properties_length


def all_properties() -> bytes:
    """Every basic property present: pamqp encodes all but cluster_id, which is added by hand."""
    raw = commands.Basic.Properties(
        content_type="application/json", content_encoding="gzip",
        headers={"x-int": 1, "x-str": "value", "x-nested": {"k": [1, 2]}}, delivery_mode=2, priority=9,
        correlation_id="corr", reply_to="amq.rabbitmq.reply-to", expiration="60000", message_id="id-1",
        timestamp=datetime.datetime(2024, 5, 1, tzinfo=datetime.UTC), message_type="kind", user_id="guest",
        app_id="tests").marshal()
    flags = int.from_bytes(raw[:2], "big") | 0x0004
    raw = flags.to_bytes(2, "big") + raw[2:] + b"\x07cluster"
    assert properties_length(raw) == len(raw)
    return raw


def roundtrip(exchange: str, routing_key: str, properties: bytes, body: bytes,
              timestamp: int = 1_700_000_000_123) -> None:
    ex, rk = exchange.encode(), routing_key.encode()
    size = record_size(ex, rk, properties, len(body))
    buf = mmap.mmap(-1, size + 64)
    written = write_record(buf, 16, ex, rk, properties, body, timestamp)
    assert written == size
    assert record_length_at(buf, 16) == size
    assert record_length_at(buf, 16 + size) == 0  # zeros after the record end the data
    message, total = read_record(memoryview(buf), 16, len(buf))
    assert total == size
    assert message == StoredMessage(timestamp, exchange, routing_key, properties, body)
    assert isinstance(message.body, bytes)


EMPTY_PROPS = b"\x00\x00"


@pytest.mark.parametrize(("exchange", "routing_key", "properties", "body"), [
    ("amq.direct", "key", EMPTY_PROPS, b""),
    ("", "queue-name", b"\x10\x00\x02", b"hello"),
    ("", "", EMPTY_PROPS, b"\x00" * 10),
    ("x" * 255, "r" * 255, EMPTY_PROPS, b"body"),
    ("ex-ü", "clé.ünïcode", EMPTY_PROPS, b"utf-8 names"),
    ("amq.topic", "a.b.c", all_properties(), b"with every property"),
    ("big", "body", all_properties(), bytes(range(256)) * 8192),  # 2 MiB
], ids=["empty-body", "default-exchange", "all-empty", "255-byte-names", "unicode-names", "all-properties",
        "2MiB-body"])
def test_roundtrip(exchange: str, routing_key: str, properties: bytes, body: bytes) -> None:
    roundtrip(exchange, routing_key, properties, body)


@settings(max_examples=60, deadline=None)
@given(exchange=st.text(max_size=60), routing_key=st.text(max_size=60), body=st.binary(max_size=2000),
       timestamp=st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_roundtrip_any(exchange: str, routing_key: str, body: bytes, timestamp: int) -> None:
    roundtrip(exchange, routing_key, all_properties(), body, timestamp)


def test_names_longer_than_255_bytes_are_refused() -> None:
    buf = bytearray(1000)
    with pytest.raises(ValueError):
        write_record(buf, 0, b"e" * 256, b"", EMPTY_PROPS, b"", 0)


def test_header_written_and_crc_covers_payload() -> None:
    buf = bytearray(200)
    size = write_record(buf, 0, b"ex", b"rk", EMPTY_PROPS, b"abc", 5)
    length, crc = read_header(buf, 0)
    assert length == size - HEADER_SIZE
    assert crc == zlib.crc32(bytes(buf[HEADER_SIZE:size]))


def test_every_flipped_byte_is_detected() -> None:
    props = all_properties()
    buf = bytearray(2048)
    size = write_record(buf, 4, b"amq.direct", b"some.key", props, b"the message body", 42)
    original = bytes(buf)
    for index in range(4, 4 + size):
        for flip in (0x01, 0x80, 0xFF):
            buf[index] ^= flip
            with pytest.raises(CorruptRecord):
                read_record(buf, 4, len(buf))
            buf[:] = original
    assert read_record(buf, 4, len(buf))[0].body == b"the message body"


def test_bounds_are_checked() -> None:
    buf = bytearray(200)
    size = write_record(buf, 0, b"", b"q", EMPTY_PROPS, b"x" * 50, 1)
    with pytest.raises(CorruptRecord, match="runs past"):
        read_record(buf, 0, size - 1)  # the record does not fit before end
    with pytest.raises(CorruptRecord, match="header"):
        read_record(buf, 196, 200)
    with pytest.raises(CorruptRecord, match="invalid length"):
        read_record(buf, size, len(buf))  # zeros: no record here


def test_consistent_crc_but_wrong_body_size_is_detected() -> None:
    # A record whose CRC matches but whose fields disagree with its length (a writer bug, not a torn
    # write) must still not be returned.
    payload = struct.pack("<q", 1) + b"\x00\x00" + EMPTY_PROPS + struct.pack("<Q", 99) + b"abc"
    buf = bytearray(struct.pack("<II", len(payload), zlib.crc32(payload)) + payload)
    with pytest.raises(CorruptRecord, match="body size"):
        read_record(buf, 0, len(buf))
