"""The client side of the codec: frames a client sends to a broker and the hot ones it parses back.

Used by lavinpy's own clients (the Spark data source, lavinpy-perf, the end-to-end test client),
which talk to a broker over the network only. Rare methods go through pamqp (``writer.method_frame``
and ``decode_method``); basic.publish with its content, basic.deliver, basic.ack/nack and
basic.return are packed and parsed by hand, since pamqp's generic (un)marshalling costs about ten
times more per message. Frames are split by ``split_frames``, which checks sizes and frame ends.
"""

from __future__ import annotations

import struct
from typing import Any, cast

from pamqp import commands
from pamqp.base import Frame
from pamqp.exceptions import UnmarshalingException

from lavinpy.wire.accel import cclient, cwire
from lavinpy.wire.constants import CLASS_BASIC, FRAME_BODY, FRAME_END, FRAME_HEADER, FRAME_METHOD
from lavinpy.wire.writer import content_frames

__all__ = [
    "BASIC_ACK",
    "BASIC_DELIVER",
    "BASIC_NACK",
    "BASIC_RETURN",
    "FRAME_HEAD",
    "ContentPacker",
    "WireError",
    "decode_method",
    "encode_shortstr",
    "frame",
    "method_id",
    "pack_publishes",
    "pack_publishes_arrow",
    "parse_ack",
    "parse_deliver",
    "parse_header",
    "parse_return",
    "publish_method_frame",
    "single_content_frames",
    "split_content_frames",
    "split_frames",
]

FRAME_END_BYTE = bytes((FRAME_END,))

# (class_id << 16) | method_id of the methods parsed by hand.
BASIC_RETURN = (60 << 16) | 50
BASIC_DELIVER = (60 << 16) | 60
BASIC_ACK = (60 << 16) | 80
BASIC_NACK = (60 << 16) | 120

FRAME_HEAD = struct.Struct(">BHI")  # type, channel, payload size
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_METHOD_IDS = struct.Struct(">HH")
_TAG_BITS = struct.Struct(">QB")
_HEADER_HEAD = struct.Struct(">HHQH")  # class, weight, body size, property flags
_CONTENT_HEAD = struct.Struct(">BHIHHQ")


class WireError(ValueError):
    """Bytes from the peer that do not parse as AMQP 0-9-1."""


def encode_shortstr(value: str | bytes) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    if len(raw) > 255:
        raise ValueError(f"short string longer than 255 bytes: {raw[:40]!r}...")
    return bytes((len(raw),)) + raw


def frame(frame_type: int, channel: int, payload: bytes) -> bytes:
    """A frame of any type around ``payload``."""
    return FRAME_HEAD.pack(frame_type, channel, len(payload)) + payload + FRAME_END_BYTE


def split_frames(buf: bytes | bytearray, frame_max: int = 0) -> tuple[list[tuple[int, int, bytes]], int]:
    """The complete frames at the start of ``buf`` as (type, channel, payload), and the bytes they used.

    Raises WireError for a frame without its end octet or (with ``frame_max``) larger than allowed.
    """
    if cwire is None:
        return _split_frames(buf, frame_max)
    frames, pos, bad = cwire.split_frames(buf, frame_max)
    if bad:  # the Python loop raises the error for the frame C stopped at
        _split_frames(buf[pos:], frame_max)
    return frames, pos


def _split_frames(buf: bytes | bytearray, frame_max: int = 0) -> tuple[list[tuple[int, int, bytes]], int]:
    frames: list[tuple[int, int, bytes]] = []
    pos, total = 0, len(buf)
    unpack = FRAME_HEAD.unpack_from
    while total - pos >= 8:
        ftype, channel, size = unpack(buf, pos)
        if frame_max and size + 8 > frame_max:
            raise WireError(f"frame of {size + 8} bytes exceeds frame_max {frame_max}")
        end = pos + 7 + size  # offset of the frame-end octet
        if end >= total:
            break
        if buf[end] != FRAME_END:
            raise WireError(f"frame end octet is 0x{buf[end]:02x}, expected 0xce")
        frames.append((ftype, channel, bytes(buf[pos + 7:end])))
        pos = end + 1
    return frames, pos


def method_id(payload: bytes | bytearray) -> int:
    """(class id << 16) | method id of a method frame's payload."""
    return (payload[0] << 24) | (payload[1] << 16) | (payload[2] << 8) | payload[3]


_METHODS = cast(dict[int, type[Frame]], commands.INDEX_MAPPING)


def decode_method(payload: bytes) -> Any:
    """A method frame's payload as a pamqp command (for the rare methods)."""
    cls = _METHODS.get(_U32.unpack_from(payload, 0)[0]) if len(payload) >= 4 else None
    if cls is None:
        raise WireError(f"unknown method {payload[:4].hex()}")
    method = cls.__new__(cls)  # unmarshal sets every field; __init__ would warn for deprecated methods
    try:
        method.unmarshal(payload[4:])
    except (UnmarshalingException, ValueError, struct.error, IndexError) as err:
        raise WireError(f"cannot decode {cls.name}: {err}") from err
    return method


def publish_method_frame(channel: int, exchange: str, routing_key: str, mandatory: bool) -> bytes:
    """A complete basic.publish method frame (reused for every message with the same target)."""
    payload = (_METHOD_IDS.pack(60, 40) + b"\x00\x00" + encode_shortstr(exchange)
               + encode_shortstr(routing_key) + (b"\x01" if mandatory else b"\x00"))
    return frame(FRAME_METHOD, channel, payload)


class ContentPacker:
    """Packs the content header frame and the body frame head of one message in one struct call.

    The property list is fixed per packer (one per distinct property set), so the per-message work
    is a single ``pack`` plus the body: about a microsecond in CPython.
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
        return self._struct.pack(FRAME_HEADER, ch, self._header_size, CLASS_BASIC, 0, body_size, self._props,
                                 FRAME_END, FRAME_BODY, ch, body_size)


def single_content_frames(channel: int, properties: bytes, body: bytes) -> bytes:
    """Header frame + one body frame (the body must fit in frame_max - 8); ``writer.content_frames``
    splits larger bodies."""
    size = len(body)
    header = (_CONTENT_HEAD.pack(FRAME_HEADER, channel, 12 + len(properties), CLASS_BASIC, 0, size), properties,
              FRAME_END_BYTE)
    if not size:
        return b"".join(header)  # an empty body has no body frame at all
    return b"".join((*header, FRAME_HEAD.pack(FRAME_BODY, channel, size), body, FRAME_END_BYTE))


def split_content_frames(channel: int, properties: bytes, body: bytes, frame_max: int) -> bytes:
    """Header frame + body frames of at most ``frame_max`` bytes each."""
    return b"".join(content_frames(channel, properties, body, frame_max))


def parse_ack(payload: bytes) -> tuple[int, bool]:
    """basic.ack / basic.nack payload -> (delivery tag, multiple)."""
    tag, bits = _TAG_BITS.unpack_from(payload, 4)
    return tag, bool(bits & 1)


def _shortstr_at(buf: bytes, pos: int) -> tuple[str, int]:
    n = buf[pos]
    return buf[pos + 1:pos + 1 + n].decode(errors="replace"), pos + 1 + n


def parse_deliver(payload: bytes) -> tuple[int, bool, str, str]:
    """basic.deliver -> (delivery tag, redelivered, exchange, routing key)."""
    pos = 5 + payload[4]
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
    """Content header -> (body size, property flags); the property block starts at byte 12."""
    _cls, _weight, size, flags = _HEADER_HEAD.unpack_from(payload, 0)
    return size, flags


def pack_publishes(out: bytearray, method_frame: bytes, channel: int, properties: bytes, bodies: list[bytes],
                   start: int, max_count: int, max_bytes: int, max_inline: int) -> int:
    """Append publishes of ``bodies[start:]`` (``method_frame``, a content header with ``properties``,
    one body frame) to ``out`` while fewer than ``max_count`` are packed and ``out`` is shorter than
    ``max_bytes``; returns the index of the first body not packed. Stops at a body that is not
    bytes, is empty or is longer than ``max_inline`` (the caller frames that one)."""
    if cclient is not None:
        return cclient.pack_publishes(out, method_frame, channel, properties, bodies, start, max_count, max_bytes,
                                      max_inline)
    return _pack_publishes(out, method_frame, channel, properties, bodies, start, max_count, max_bytes, max_inline)


def _pack_publishes(out: bytearray, method_frame: bytes, channel: int, properties: bytes, bodies: list[bytes],
                    start: int, max_count: int, max_bytes: int, max_inline: int) -> int:
    if not 0 <= start <= len(bodies) or max_count < 0:
        raise IndexError("pack_publishes: start or max_count out of range")
    end = min(len(bodies), start + max_count)
    pack = ContentPacker(channel, properties).pack
    i = start
    while i < end and len(out) < max_bytes:
        body = bodies[i]
        if type(body) is not bytes or not 0 < len(body) <= max_inline:
            break
        out += method_frame
        out += pack(len(body))
        out += body
        out += FRAME_END_BYTE
        i += 1
    return i


def pack_publishes_arrow(out: bytearray, method_frame: bytes, channel: int, properties: bytes, offsets: Any,
                         data: Any, start: int, end: int, max_count: int, max_bytes: int, max_inline: int) -> int:
    """``pack_publishes`` for the bodies of an Arrow binary array, read from its buffers (no bytes
    object a body): body i is ``data[offsets[i]:offsets[i + 1]]`` (``offsets`` little-endian int32),
    for ``start <= i < end``. Returns the index of the first body not packed: it stops at a body that
    is empty or longer than ``max_inline``, or whose offsets do not lie within ``data`` in order."""
    if cclient is not None:
        return cast(int, cclient.pack_publishes_arrow(out, method_frame, channel, properties, offsets, data, start,
                                                       end, max_count, max_bytes, max_inline))
    return _pack_publishes_arrow(out, method_frame, channel, properties, offsets, data, start, end, max_count,
                                 max_bytes, max_inline)


def _pack_publishes_arrow(out: bytearray, method_frame: bytes, channel: int, properties: bytes, offsets: Any,
                          data: Any, start: int, end: int, max_count: int, max_bytes: int, max_inline: int) -> int:
    ends = memoryview(offsets).cast("B")
    n_offsets = len(ends) // 4
    if start < 0 or end < start or end >= n_offsets or max_count < 0:
        raise IndexError("pack_publishes_arrow: start, end or max_count out of range")
    end = min(end, start + max_count)
    raw = memoryview(data).cast("B")
    pack = ContentPacker(channel, properties).pack
    i = start
    lo = int.from_bytes(ends[4 * i:4 * i + 4], "little", signed=True)
    while i < end and len(out) < max_bytes:
        hi = int.from_bytes(ends[4 * i + 4:4 * i + 8], "little", signed=True)
        if lo < 0 or hi <= lo or hi > len(raw) or hi - lo > max_inline:
            break
        out += method_frame
        out += pack(hi - lo)
        out += raw[lo:hi]
        out += FRAME_END_BYTE
        lo = hi
        i += 1
    return i


