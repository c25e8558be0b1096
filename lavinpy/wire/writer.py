"""Frame builders: everything the server sends, as bytes ready for ``transport.write(lines)``.

Rare methods go through pamqp (``method_frame``); the per-message frames (basic.deliver, get-ok,
return, ack/nack) are packed by hand from pre-encoded pieces, and a small message's method, header
and body frames come back as one bytes object so the transport gets one write per message.
"""

from __future__ import annotations

import struct
from typing import Any

from lavinpy.wire.accel import cwire
from lavinpy.wire.constants import (
    CLASS_BASIC,
    FRAME_BODY,
    FRAME_END,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
)
from lavinpy.wire.frames import method_fields

__all__ = [
    "HEARTBEAT",
    "basic_ack",
    "basic_nack",
    "content_frames",
    "deliver",
    "get_ok",
    "method_frame",
    "return_",
]

HEARTBEAT: bytes = struct.pack(">BHIB", FRAME_HEARTBEAT, 0, 0, FRAME_END)

_END = bytes((FRAME_END,))
_FRAME_HEAD = struct.Struct(">BHI")
# The previous frame's end octet is packed together with the next frame's head: one piece fewer to join.
_END_HEADER_HEAD = struct.Struct(">BBHIHHQ")  # end, type 2, channel, size, class id, weight, body size
_END_BODY_HEAD = struct.Struct(">BBHI")  # end, type 3, channel, size
_HEADER_HEAD = struct.Struct(">BHIHHQ")
_METHOD_HEAD = struct.Struct(">BHII")  # type 1, channel, size, class id + method id
_TAG_BIT = struct.Struct(">QB")
_ACK = struct.Struct(">BHIIQBB")  # a whole basic.ack / basic.nack frame
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")

_IDX_RETURN = 0x003C0032
_IDX_DELIVER = 0x003C003C
_IDX_GET_OK = 0x003C0047
_IDX_ACK = 0x003C0050
_IDX_NACK = 0x003C0078

# Encoded short strings (length octet + UTF-8): consumer tags, exchange names and routing keys repeat
# for every delivery. Bounded: cleared when full, since routing keys can be unbounded in variety.
_SHORTSTR_CACHE_MAX = 8192
_shortstr_cache: dict[str, bytes] = {}


def _shortstr(value: str) -> bytes:
    encoded = _shortstr_cache.get(value)
    if encoded is None:
        data = value.encode("utf-8")
        if len(data) > 255:
            # The channel validates names and keys on the way in; reaching here is a bug.
            raise ValueError(f"short string of {len(data)} bytes (max 255): {value[:40]!r}...")
        encoded = bytes((len(data),)) + data
        if len(_shortstr_cache) >= _SHORTSTR_CACHE_MAX:
            _shortstr_cache.clear()
        _shortstr_cache[value] = encoded
    return encoded


def method_frame(channel: int, method: Any) -> bytes:
    """A method frame for any pamqp command instance (any exchange or queue name AMQP allows) or an
    EncodedMethod."""
    if isinstance(method, EncodedMethod):
        return encoded_method_frame(channel, method.index, method.payload)
    return encoded_method_frame(channel, method.index, method_fields(method))


class EncodedMethod:
    """A method whose fields were encoded by its maker (say, an arguments table with types of its own
    choosing); ``method_frame`` sends it as it is."""

    __slots__ = ("name", "index", "payload")

    def __init__(self, name: str, index: int, payload: bytes) -> None:
        self.name, self.index, self.payload = name, index, payload


def encoded_method_frame(channel: int, index: int, payload: bytes) -> bytes:
    """A method frame around fields already encoded (``index``: the method's class and method ids)."""
    return b"".join((_METHOD_HEAD.pack(FRAME_METHOD, channel, 4 + len(payload), index), payload, _END))


def _body_frames(channel: int, body: bytes | memoryview, chunk: int) -> list[bytes]:
    size = len(body)
    pack = _FRAME_HEAD.pack
    return [b"".join((pack(FRAME_BODY, channel, len(part)), part, _END))
            for part in (body[i:i + chunk] for i in range(0, size, chunk))]


# Body frames at least this long are not copied into frames of their own: the output holds each frame's
# head and end octets around a memoryview slice of the body, and the driver writes the slices as they are.
PIECE_MIN = 32 * 1024


def _body_pieces(channel: int, body: bytes | memoryview, chunk: int) -> list[bytes | memoryview]:
    """The body frames as pieces: the first frame's head, then each slice of the body followed by
    its end octet packed with the next frame's head, and the last end octet. No body byte is copied."""
    view = body if type(body) is memoryview else memoryview(body)
    size = len(view)
    end_head = _END_BODY_HEAD.pack
    pieces: list[bytes | memoryview] = [_FRAME_HEAD.pack(FRAME_BODY, channel, min(chunk, size))]
    add = pieces.append
    for i in range(0, size, chunk):
        add(view[i:i + chunk])
        rest = size - i - chunk
        add(end_head(FRAME_END, FRAME_BODY, channel, min(chunk, rest)) if rest > 0 else _END)
    return pieces


def _chunk_size(frame_max: int) -> int:
    # frame_max 0 means "no limit" in connection.tune.
    return frame_max - 8 if frame_max > 0 else 1 << 62


def content_frames(channel: int, properties: bytes, body: bytes | memoryview, frame_max: int,
                   class_id: int = CLASS_BASIC) -> list[bytes]:
    """A content header frame, then the body in frames of at most ``frame_max`` bytes (none if empty)."""
    size = len(body)
    head = _HEADER_HEAD.pack(FRAME_HEADER, channel, 12 + len(properties), class_id, 0, size)
    header = b"".join((head, properties, _END))
    if not size:
        return [header]
    return [header, *_body_frames(channel, body, _chunk_size(frame_max))]


def _with_content(method_part: list, channel: int, properties: bytes, body: bytes | memoryview,
                  frame_max: int) -> list[bytes | memoryview]:
    """Finish ``method_part`` (a method frame without its end octet) with header and body frames.

    A body that fits one frame is joined with the method and header into a single bytes object.
    """
    size = len(body)
    method_part.append(
        _END_HEADER_HEAD.pack(FRAME_END, FRAME_HEADER, channel, 12 + len(properties), CLASS_BASIC, 0, size))
    method_part.append(properties)
    chunk = _chunk_size(frame_max)
    if size <= chunk:
        if size:
            method_part.append(_END_BODY_HEAD.pack(FRAME_END, FRAME_BODY, channel, size))
            method_part.append(body)
        method_part.append(_END)
        return [b"".join(method_part)]
    method_part.append(_END)
    if chunk >= PIECE_MIN:  # large frames: the body's bytes go out as slices, never joined here
        return [b"".join(method_part), *_body_pieces(channel, body, chunk)]
    return [b"".join(method_part), *_body_frames(channel, body, chunk)]


# (channel, consumer tag, exchange, routing key) -> the deliver frame's bytes before and after the
# delivery tag: a consumer receives long runs of messages with the same exchange and routing key.
_DELIVER_CACHE_MAX = 4096
_deliver_parts_cache: dict[tuple[int, str, str, str], tuple[bytes, bytes]] = {}


def _deliver_parts(channel: int, consumer_tag: str, exchange: str, routing_key: str) -> tuple[bytes, bytes]:
    tag = _shortstr(consumer_tag)
    names = _shortstr(exchange) + _shortstr(routing_key)
    size = 4 + len(tag) + 9 + len(names)
    parts = (_METHOD_HEAD.pack(FRAME_METHOD, channel, size, _IDX_DELIVER) + tag, names)
    if len(_deliver_parts_cache) >= _DELIVER_CACHE_MAX:
        _deliver_parts_cache.clear()
    _deliver_parts_cache[(channel, consumer_tag, exchange, routing_key)] = parts
    return parts


def deliver(channel: int, consumer_tag: str, delivery_tag: int, redelivered: bool, exchange: str,
            routing_key: str, properties: bytes, body: bytes | memoryview, frame_max: int) -> list[bytes | memoryview]:
    """basic.deliver + content header + body frames."""
    parts = (_deliver_parts_cache.get((channel, consumer_tag, exchange, routing_key))
             or _deliver_parts(channel, consumer_tag, exchange, routing_key))
    size = len(body)
    if 0 < size <= frame_max - 8:  # the common case, inlined: one bytes object for all three frames
        return [_deliver_frames(parts[0], parts[1], channel, delivery_tag, redelivered, properties, body)]
    return _with_content([parts[0], _TAG_BIT.pack(delivery_tag, redelivered), parts[1]],
                         channel, properties, body, frame_max)


def deliver_frames_py(head: bytes, names: bytes, channel: int, delivery_tag: int, redelivered: bool,
                      properties: bytes, body: bytes | memoryview) -> bytes:
    """basic.deliver + header + one body frame as one bytes object (``_cwire.deliver_frames`` in C)."""
    size = len(body)
    return b"".join((
        head, _TAG_BIT.pack(delivery_tag, redelivered), names,
        _END_HEADER_HEAD.pack(FRAME_END, FRAME_HEADER, channel, 12 + len(properties), CLASS_BASIC, 0, size),
        properties, _END_BODY_HEAD.pack(FRAME_END, FRAME_BODY, channel, size), body, _END))


_deliver_frames = cwire.deliver_frames if cwire is not None else deliver_frames_py


deliver_py = deliver
if cwire is not None:
    # One C call for the common delivery; the others (and cache misses) come back to deliver_py.
    cwire.init_deliver(_deliver_parts_cache, deliver_py)
    deliver = cwire.deliver  # noqa: F811


def deliver_run(channel: int, consumer_tag: str, first_tag: int, redelivered: list[bool] | None,
                messages: list, frame_max: int) -> list[bytes | memoryview]:
    """``deliver`` for consecutive delivery tags from ``first_tag``, one message each (objects with
    exchange, routing_key, properties and body); ``redelivered`` None means all False."""
    frames: list[bytes | memoryview] = []
    add = frames.extend
    one = deliver_py
    tag = first_tag
    if redelivered is None:
        for msg in messages:
            add(one(channel, consumer_tag, tag, False, msg.exchange, msg.routing_key, msg.properties,
                    msg.body, frame_max))
            tag += 1
    else:
        for msg, again in zip(messages, redelivered, strict=True):
            add(one(channel, consumer_tag, tag, again, msg.exchange, msg.routing_key, msg.properties,
                    msg.body, frame_max))
            tag += 1
    return frames


deliver_run_py = deliver_run
if cwire is not None:
    # Consecutive common deliveries in one bytes object; the others through deliver_py.
    deliver_run = cwire.deliver_run  # noqa: F811


def deliver_stamped_run(channel: int, consumer_tag: str, first_tag: int, messages: list, frame_max: int,
                        first_offset: int, splices: dict[bytes, tuple[bytes, bytes]]
                        ) -> tuple[list[bytes | memoryview], int]:
    """``deliver_run`` (none redelivered) of a stream's run with each message's ``x-stream-offset``
    (``first_offset`` on) stamped as its block's splice gives it: ``splices[properties]`` is the
    stamped block's bytes before and after the 8-byte value. Stops at the first message whose block
    has no splice yet and returns its index with the frames of those before it."""
    frames: list[bytes | memoryview] = []
    for i, msg in enumerate(messages):
        splice = splices.get(msg.properties)
        if splice is None:
            return frames, i
        stamped = splice[0] + (first_offset + i).to_bytes(8, "big", signed=True) + splice[1]
        frames += deliver_py(channel, consumer_tag, first_tag + i, False, msg.exchange, msg.routing_key, stamped,
                             msg.body, frame_max)
    return frames, len(messages)


deliver_stamped_run_py = deliver_stamped_run
if cwire is not None:
    # Also stops where the deliver parts are not cached or a body needs the general framing.
    deliver_stamped_run = cwire.deliver_stamped_run  # noqa: F811


def get_ok(channel: int, delivery_tag: int, redelivered: bool, exchange: str, routing_key: str,
           message_count: int, properties: bytes, body: bytes | memoryview, frame_max: int) -> list[bytes | memoryview]:
    """basic.get-ok + content header + body frames."""
    ex = _shortstr(exchange)
    key = _shortstr(routing_key)
    size = 4 + 9 + len(ex) + len(key) + 4
    return _with_content(
        [_METHOD_HEAD.pack(FRAME_METHOD, channel, size, _IDX_GET_OK),
         _TAG_BIT.pack(delivery_tag, 1 if redelivered else 0), ex, key, _U32.pack(message_count)],
        channel, properties, body, frame_max)


def return_(channel: int, reply_code: int, reply_text: str, exchange: str, routing_key: str,
            properties: bytes, body: bytes | memoryview, frame_max: int) -> list[bytes | memoryview]:
    """basic.return + content header + body frames (an unroutable mandatory message going back)."""
    text = _shortstr(reply_text)
    ex = _shortstr(exchange)
    key = _shortstr(routing_key)
    size = 4 + 2 + len(text) + len(ex) + len(key)
    return _with_content(
        [_METHOD_HEAD.pack(FRAME_METHOD, channel, size, _IDX_RETURN), _U16.pack(reply_code), text, ex, key],
        channel, properties, body, frame_max)


def basic_ack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    """basic.ack (a publisher confirm)."""
    return _ack_frame(_IDX_ACK, channel, delivery_tag, 1 if multiple else 0)


def basic_nack(channel: int, delivery_tag: int, multiple: bool, requeue: bool = False) -> bytes:
    """basic.nack (a negative publisher confirm)."""
    bits = (1 if multiple else 0) | (2 if requeue else 0)
    return _ack_frame(_IDX_NACK, channel, delivery_tag, bits)


def ack_frame_py(index: int, channel: int, delivery_tag: int, bits: int) -> bytes:
    """A basic.ack / basic.nack frame (``_cwire.ack_frame`` in C)."""
    return _ACK.pack(FRAME_METHOD, channel, 13, index, delivery_tag, bits, FRAME_END)


_ack_frame = cwire.ack_frame if cwire is not None else ack_frame_py
