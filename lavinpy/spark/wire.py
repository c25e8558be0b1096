"""AMQP 0-9-1 wire encoding for the Spark connector's clients (no sockets).

Only the frames a publisher with confirms and a stream consumer need. The hot ones (basic.publish
with its content, basic.deliver, basic.ack/nack, content headers) are packed and parsed by hand
because pamqp's generic (un)marshalling costs ~10x more per message; rare control methods go
through pamqp (see client.py).
"""

from __future__ import annotations

import datetime as _dt
import struct
from decimal import Decimal
from typing import Any

from lavinpy.wire import field_table

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
FRAME_END_BYTE = b"\xce"
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"

# (class_id << 16) | method_id of the methods parsed by hand.
BASIC_DELIVER = (60 << 16) | 60
BASIC_RETURN = (60 << 16) | 50
BASIC_ACK = (60 << 16) | 80
BASIC_NACK = (60 << 16) | 120

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_F32 = struct.Struct(">f")
_F64 = struct.Struct(">d")
_FRAME_HEAD = struct.Struct(">BHI")
_METHOD_IDS = struct.Struct(">HH")
_ACK = struct.Struct(">QB")
_HEADER_HEAD = struct.Struct(">HHQH")  # class, weight, body size, property flags

# Basic property flags, in wire order.
F_CONTENT_TYPE = 0x8000
F_CONTENT_ENCODING = 0x4000
F_HEADERS = 0x2000
F_DELIVERY_MODE = 0x1000
F_PRIORITY = 0x0800
F_CORRELATION_ID = 0x0400
F_REPLY_TO = 0x0200
F_EXPIRATION = 0x0100
F_MESSAGE_ID = 0x0080
F_TIMESTAMP = 0x0040
F_TYPE = 0x0020
F_USER_ID = 0x0010
F_APP_ID = 0x0008
F_CLUSTER_ID = 0x0004

# Order of the fields in a decoded property tuple (see decode_properties).
PROPERTY_NAMES = ("content_type", "content_encoding", "headers", "delivery_mode", "priority",
                  "correlation_id", "reply_to", "expiration", "message_id", "timestamp", "type",
                  "user_id", "app_id", "cluster_id")


class WireError(ValueError):
    """Bytes from the peer that do not parse as AMQP 0-9-1."""


# --- field tables ---------------------------------------------------------------------------------

def encode_shortstr(value: str | bytes) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    if len(raw) > 255:
        raise ValueError(f"short string longer than 255 bytes: {raw[:40]!r}...")
    return _U8.pack(len(raw)) + raw


def encode_value(value: Any) -> bytes:
    """One typed field value, as RabbitMQ's clients encode them (ints as signed 64-bit 'l')."""
    if isinstance(value, bool):
        return b"t\x01" if value else b"t\x00"
    if isinstance(value, int):
        return b"l" + _I64.pack(value)
    if isinstance(value, str):
        raw = value.encode()
        return b"S" + _U32.pack(len(raw)) + raw
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        return b"x" + _U32.pack(len(raw)) + raw
    if isinstance(value, float):
        return b"d" + _F64.pack(value)
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.UTC)
        return b"T" + _U64.pack(int(value.timestamp()))
    if isinstance(value, Decimal):
        sign, digits, exponent = value.as_tuple()
        scale = -int(exponent) if isinstance(exponent, int) and exponent < 0 else 0
        unscaled = int(value.scaleb(scale))
        return b"D" + _U8.pack(scale) + _I32.pack(unscaled)
    if isinstance(value, dict):
        return b"F" + encode_table(value)
    if isinstance(value, list | tuple):
        body = b"".join(encode_value(v) for v in value)
        return b"A" + _U32.pack(len(body)) + body
    if value is None:
        return b"V"
    raise TypeError(f"cannot encode {type(value).__name__} in an AMQP field table")


def encode_table(table: dict[str, Any] | None) -> bytes:
    if not table:
        return b"\x00\x00\x00\x00"
    body = b"".join(encode_shortstr(k) + encode_value(v) for k, v in table.items())
    return _U32.pack(len(body)) + body


def decode_table(buf: bytes, pos: int, end: int) -> dict[str, Any]:
    """Decode the table entries in buf[pos:end] (after the 4-byte length) into plain Python values.

    The broker's field-table codec does it (nesting limit and all): a malformed table raises WireError.
    """
    try:
        return field_table.decode_table(buf, pos, end, typed=False)
    except field_table.FieldTableError as err:
        raise WireError(f"malformed field table: {err}") from err


# --- basic properties -----------------------------------------------------------------------------

def encode_properties(content_type: str | None = None, headers: dict[str, Any] | None = None,
                      delivery_mode: int | None = None, priority: int | None = None,
                      correlation_id: str | None = None, reply_to: str | None = None,
                      expiration: str | None = None, message_id: str | None = None,
                      timestamp: int | None = None, type: str | None = None,
                      user_id: str | None = None, app_id: str | None = None,
                      content_encoding: str | None = None) -> bytes:
    """Property flags + property list of a content header (timestamp in epoch seconds)."""
    flags = 0
    parts: list[bytes] = []
    if content_type is not None:
        flags |= F_CONTENT_TYPE
        parts.append(encode_shortstr(content_type))
    if content_encoding is not None:
        flags |= F_CONTENT_ENCODING
        parts.append(encode_shortstr(content_encoding))
    if headers is not None:
        flags |= F_HEADERS
        parts.append(encode_table(headers))
    if delivery_mode is not None:
        flags |= F_DELIVERY_MODE
        parts.append(_U8.pack(delivery_mode))
    if priority is not None:
        flags |= F_PRIORITY
        parts.append(_U8.pack(priority))
    for flag, value in ((F_CORRELATION_ID, correlation_id), (F_REPLY_TO, reply_to),
                        (F_EXPIRATION, expiration), (F_MESSAGE_ID, message_id)):
        if value is not None:
            flags |= flag
            parts.append(encode_shortstr(value))
    if timestamp is not None:
        flags |= F_TIMESTAMP
        parts.append(_U64.pack(timestamp))
    for flag, value in ((F_TYPE, type), (F_USER_ID, user_id), (F_APP_ID, app_id)):
        if value is not None:
            flags |= flag
            parts.append(encode_shortstr(value))
    return _U16.pack(flags) + b"".join(parts)


def _shortstr_at(buf: bytes, pos: int) -> tuple[str, int]:
    n = buf[pos]
    return buf[pos + 1:pos + 1 + n].decode(errors="replace"), pos + 1 + n


def decode_properties(buf: bytes, pos: int, flags: int) -> list[Any]:
    """Decode a property list starting at pos into a 14-item list ordered as PROPERTY_NAMES."""
    props: list[Any] = [None] * 14
    if flags & 0x0001:
        raise WireError("content header with continued property flags (not used by AMQP 0-9-1)")
    if flags & F_CONTENT_TYPE:
        props[0], pos = _shortstr_at(buf, pos)
    if flags & F_CONTENT_ENCODING:
        props[1], pos = _shortstr_at(buf, pos)
    if flags & F_HEADERS:
        n = _U32.unpack_from(buf, pos)[0]
        props[2] = decode_table(buf, pos + 4, pos + 4 + n)
        pos += 4 + n
    if flags & F_DELIVERY_MODE:
        props[3] = buf[pos]
        pos += 1
    if flags & F_PRIORITY:
        props[4] = buf[pos]
        pos += 1
    if flags & F_CORRELATION_ID:
        props[5], pos = _shortstr_at(buf, pos)
    if flags & F_REPLY_TO:
        props[6], pos = _shortstr_at(buf, pos)
    if flags & F_EXPIRATION:
        props[7], pos = _shortstr_at(buf, pos)
    if flags & F_MESSAGE_ID:
        props[8], pos = _shortstr_at(buf, pos)
    if flags & F_TIMESTAMP:
        props[9] = _U64.unpack_from(buf, pos)[0]
        pos += 8
    if flags & F_TYPE:
        props[10], pos = _shortstr_at(buf, pos)
    if flags & F_USER_ID:
        props[11], pos = _shortstr_at(buf, pos)
    if flags & F_APP_ID:
        props[12], pos = _shortstr_at(buf, pos)
    if flags & F_CLUSTER_ID:
        props[13], pos = _shortstr_at(buf, pos)
    return props


# --- frames ---------------------------------------------------------------------------------------

def frame(frame_type: int, channel: int, payload: bytes) -> bytes:
    return _FRAME_HEAD.pack(frame_type, channel, len(payload)) + payload + FRAME_END_BYTE


def publish_method_frame(channel: int, exchange: str, routing_key: str, mandatory: bool) -> bytes:
    """A complete basic.publish method frame (reused for every message with the same target)."""
    payload = (_METHOD_IDS.pack(60, 40) + b"\x00\x00" + encode_shortstr(exchange)
               + encode_shortstr(routing_key) + (b"\x01" if mandatory else b"\x00"))
    return frame(FRAME_METHOD, channel, payload)


class ContentPacker:
    """Packs the content header frame and the body frame head of one message in one struct call.

    The property list is fixed per packer (one per distinct property set), so the per-message work
    is a single `pack` plus the body: about a microsecond in CPython.
    """

    __slots__ = ("_struct", "_channel", "_props", "_header_size")

    def __init__(self, channel: int, properties: bytes) -> None:
        self._channel = channel
        self._props = properties
        self._header_size = 12 + len(properties)
        # header frame (type, channel, size, class, weight, body size, props, end) + body frame head
        self._struct = struct.Struct(f">BHIHHQ{len(properties)}sBBHI")

    def pack(self, body_size: int) -> bytes:
        ch = self._channel
        return self._struct.pack(FRAME_HEADER, ch, self._header_size, 60, 0, body_size, self._props,
                                 FRAME_END, FRAME_BODY, ch, body_size)


_CONTENT_HEAD = struct.Struct(">BHIHHQ")


def content_frames(channel: int, properties: bytes, body: bytes) -> bytes:
    """Header frame + one body frame (body must fit in frame_max - 8) for any property list."""
    size = len(body)
    header = (_CONTENT_HEAD.pack(FRAME_HEADER, channel, 12 + len(properties), 60, 0, size), properties,
              FRAME_END_BYTE)
    if not size:
        return b"".join(header)  # an empty body has no body frame at all
    return b"".join((*header, _FRAME_HEAD.pack(FRAME_BODY, channel, size), body, FRAME_END_BYTE))


def encode_content(channel: int, properties: bytes, body: bytes, frame_max: int) -> bytes:
    """Header frame + body frames for a body that needs splitting (or any body, slowly)."""
    head = _HEADER_HEAD.pack(60, 0, len(body), 0)[:-2] + properties
    parts = [frame(FRAME_HEADER, channel, head)]
    step = frame_max - 8
    for start in range(0, len(body), step):
        parts.append(frame(FRAME_BODY, channel, body[start:start + step]))
    return b"".join(parts)


def parse_ack(payload: bytes) -> tuple[int, bool]:
    """basic.ack / basic.nack payload (after the 4 method id bytes) -> (delivery tag, multiple)."""
    tag, bits = _ACK.unpack_from(payload, 4)
    return tag, bool(bits & 1)


def parse_deliver(payload: bytes) -> tuple[int, bool, str, str]:
    """basic.deliver -> (delivery tag, redelivered, exchange, routing key)."""
    n = payload[4]
    pos = 5 + n
    tag = _U64.unpack_from(payload, pos)[0]
    redelivered = bool(payload[pos + 8] & 1)
    exchange, pos = _shortstr_at(payload, pos + 9)
    routing_key, _ = _shortstr_at(payload, pos)
    return tag, redelivered, exchange, routing_key


def parse_return(payload: bytes) -> tuple[int, str, str, str]:
    """basic.return -> (reply code, reply text, exchange, routing key)."""
    code = _U16.unpack_from(payload, 4)[0]
    text, pos = _shortstr_at(payload, 6)
    exchange, pos = _shortstr_at(payload, pos)
    routing_key, _ = _shortstr_at(payload, pos)
    return code, text, exchange, routing_key


def parse_header(payload: bytes) -> tuple[int, int]:
    """Content header -> (body size, property flags); the property list starts at byte 14."""
    _cls, _weight, size, flags = _HEADER_HEAD.unpack_from(payload, 0)
    return size, flags


def ack_frame(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    return frame(FRAME_METHOD, channel, _METHOD_IDS.pack(60, 80) + _ACK.pack(delivery_tag, 1 if multiple else 0))


def method_id(payload: bytes) -> int:
    return (payload[0] << 24) | (payload[1] << 16) | (payload[2] << 8) | payload[3]


def unpack_frame_head(buf: bytes | bytearray, pos: int) -> tuple[int, int, int]:
    return _FRAME_HEAD.unpack_from(buf, pos)
