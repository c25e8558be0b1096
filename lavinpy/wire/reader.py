"""Sans-IO frame reader: bytes in, frame events out.

``FrameReader.feed(data)`` takes whatever the socket delivered and returns every complete frame in it;
a partial frame waits in a small buffer for the next call. Protocol violations raise
``AMQPConnectionError`` (the connection must be closed with that code) or ``BadProtocolHeader``.

The hot frames of a publishing client (basic.publish, content header, body, basic.ack/nack/reject) are
decoded by hand with ``struct.unpack_from``; every other method into pamqp's method classes by
``method_args``. The reader knows nothing about channel state: content sequencing is the channel's job.
"""

from __future__ import annotations

import struct
import sys
from typing import Any, cast

from pamqp import commands
from pamqp.base import Frame

from lavinpy.wire.accel import cwire
from lavinpy.wire.constants import (
    FRAME_BODY,
    FRAME_ERROR,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_OVERHEAD,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    PROTOCOL_HEADER,
)
from lavinpy.wire.errors import AMQPChannelError, AMQPConnectionError
from lavinpy.wire.field_table import FieldTableError
from lavinpy.wire.frames import (
    _HEARTBEAT_EVENT,
    Ack,
    AckRun,
    BodyFrame,
    ContentMessage,
    ContentRun,
    FrameEvent,
    HeaderFrame,
    HeartbeatFrame,
    MethodFrame,
    Nack,
    Publish,
    RefusedFrame,
    Reject,
)
from lavinpy.wire.method_args import decode_arguments
from lavinpy.wire.properties import (
    FIXED_PROPS_LEN,
    VALID_PROPS_MAX,
    VALID_PROPS_MAX_FRAME,
    check_content_properties,
    valid_props,
)

__all__ = [
    "Ack",
    "AckRun",
    "BadProtocolHeader",
    "BodyFrame",
    "FrameEvent",
    "FrameReader",
    "HeaderFrame",
    "HeartbeatFrame",
    "MethodFrame",
    "ContentMessage",
    "ContentRun",
    "Nack",
    "Publish",
    "RefusedFrame",
    "Reject",
]


if cwire is not None:  # the C reader builds these event classes by writing their slots
    cwire.init(BodyFrame, MethodFrame, HeaderFrame, ContentMessage, ContentRun, Ack, AckRun, _HEARTBEAT_EVENT)


class BadProtocolHeader(Exception):
    """The peer did not open with ``PROTOCOL_HEADER``: answer with it and close the socket."""

    def __init__(self, received: bytes) -> None:
        super().__init__(f"bad protocol header {received!r}")
        self.received = received


def _amqp_name(pamqp_name: str) -> str:
    """"Queue.Declare" -> "queue.declare", as RabbitMQ names methods in its reply texts."""
    return "".join("-" + c.lower() if c.isupper() and i and pamqp_name[i - 1] != "." else c.lower()
                   for i, c in enumerate(pamqp_name))


def _cannot_decode(name: str, index: int) -> AMQPConnectionError:
    # RabbitMQ answers undecodable method arguments with 501 "cannot decode <fields>" (rabbit_misc).
    return AMQPConnectionError(FRAME_ERROR, f"cannot decode {name} arguments", index >> 16, index & 0xFFFF)


# --- The reader ------------------------------------------------------------------------------------

_FRAME_HEAD = struct.Struct(">BHI")  # type, channel, payload size
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_TAG_BITS = struct.Struct(">QB")
_HEADER_HEAD = struct.Struct(">HHQ")  # class id, weight, body size
BODY_VIEW_MIN = 64 * 1024  # body frames from this size on are handed out as memoryviews of the input
_KNOWN_TYPES = frozenset((FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT))

_IDX_PUBLISH = 0x003C0028
_IDX_ACK = 0x003C0050
_IDX_REJECT = 0x003C005A
_IDX_NACK = 0x003C0078
_METHODS = cast(dict[int, type[Frame]], commands.INDEX_MAPPING)


class FrameReader:
    """Turns a byte stream from a client into frame events.

    ``frame_max`` is the largest frame accepted, overhead included (set it after connection.tune-ok).
    ``expect_protocol_header`` is True until the 8-byte protocol header has been read.
    ``compiled`` picks the C fast path (default: as ``lavinpy.wire.accel`` selected); both paths
    return the same events and raise the same errors.
    """

    __slots__ = ("frame_max", "expect_protocol_header", "methods_per_feed", "undecoded", "_budget", "_pending",
                 "_need", "_compiled", "_held")

    def __init__(self, frame_max: int = 131072, compiled: bool | None = None,
                 methods_per_feed: int | None = None) -> None:
        if compiled and cwire is None:
            raise ValueError("the compiled codec is not available")
        self._compiled = cwire is not None if compiled is None else compiled
        self.frame_max = frame_max
        # At most this many methods of the general kind (decoded through pamqp: everything but publishes,
        # acks and content) are decoded in one ``feed``, each KiB of one (its tables, checked and decoded
        # in Python at about 0.4 ms a KiB) counting as one more; the complete frames after them wait,
        # undecoded, for the next call (``undecoded`` says so), so that one read costs a bounded amount
        # of the loop's time. Content is not counted: publish runs are never split. None: no bound.
        self.methods_per_feed = methods_per_feed if methods_per_feed is not None else sys.maxsize
        self.undecoded = False
        self._budget = self.methods_per_feed
        self.expect_protocol_header = True
        # Bytes of an incomplete frame, and how many bytes it needs before parsing is worth trying.
        self._pending = bytearray()
        self._need = 0
        # The pending bytes are the start of one message's publish, header and body frames (held back
        # whole, _need bytes in all) rather than of a single frame.
        self._held = False

    @property
    def buffered(self) -> int:
        """Bytes held back waiting for the rest of a frame."""
        return len(self._pending)

    def feed(self, data: bytes | bytearray | memoryview) -> list[FrameEvent]:
        """Consume ``data`` and return the complete frames it finishes, in order (once
        ``methods_per_feed`` is spent, only those: ``undecoded`` is then True, and a call with no more
        data goes on from there).

        If a protocol error is found, the error raised carries in ``frames`` the frames decoded
        before it in this call, so the caller may still act on them before closing.
        """
        pending = self._pending
        self._budget = self.methods_per_feed
        self.undecoded = False
        events: list[FrameEvent] = []
        if not pending and type(data) is bytes and self._compiled and not self.expect_protocol_header:
            # The common read (whole frames, nothing held back) straight to the C scan: one call less
            # per read (for a consumer's read of a few acks, a tenth of its cost).
            try:
                pos, stop = cwire.scan(data, 0, self.frame_max - FRAME_OVERHEAD, events,  # type: ignore[union-attr]
                                       _publish_cache, _decode_publish, valid_props)
                if pos == len(data):
                    self._need = 7
                    return events
                pos = self._parse_compiled(data, events, pos, stop)
            except AMQPConnectionError as err:
                err.frames = events
                raise
            if pos < len(data):
                pending += memoryview(data)[pos if self.undecoded else self._hold_back(data, pos, events, 0):]
            return events
        pos = 0
        if pending:
            if len(pending) + len(data) < self._need and not self.expect_protocol_header:
                pending += data
                return []
            if ((pending[0] == FRAME_BODY or self._held) and len(pending) >= 7 and type(data) is bytes
                    and self._need > len(pending)):
                # The rest of a body frame (large bodies end most reads mid-frame), or of a message held
                # back whole: only that is joined, and the input after it is parsed where it is, not
                # copied behind it.
                pos = self._need - len(pending)
                frame = b"".join((pending, memoryview(data)[:pos]))
                pending.clear()
                self._held = False
                self._parse_from(frame, 0, events)
                if pending:  # (not one whole frame after all: the input waits behind it, as it came)
                    pending += memoryview(data)[pos:]
                    return events
                src = data
            else:
                # Parse from immutable bytes: slices of them are the bytes the events hand out. One
                # join copies both parts once (``bytes(pending) + data`` copied the pending part twice).
                src = b"".join((pending, data))
                pending.clear()
                self._held = False
        elif type(data) is bytes:
            src = data
        else:
            src = bytes(data)
        if self.expect_protocol_header:
            src = self._read_protocol_header(src)
            if not src:
                return []
        self._parse_from(src, pos, events)
        return events

    def _parse_from(self, src: bytes, pos: int, events: list[FrameEvent]) -> None:
        """Append the complete frames of ``src`` from ``pos`` to ``events``; keep the rest pending."""
        pending = self._pending
        start = pos
        try:
            if self._compiled:
                pos, stop = cwire.scan(src, pos, self.frame_max - FRAME_OVERHEAD, events,  # type: ignore[union-attr]
                                       _publish_cache, _decode_publish, valid_props)
                if pos == len(src):  # the common case: every frame was complete and handled in C
                    self._need = 7
                else:
                    pos = self._parse_compiled(src, events, pos, stop)
            else:
                pos = self._parse(src, events, pos)
        except AMQPConnectionError as err:
            err.frames = events
            raise
        if pos < len(src):
            pending += memoryview(src)[pos if self.undecoded else self._hold_back(src, pos, events, start):]

    def _hold_back(self, src: bytes, pos: int, events: list[FrameEvent], start: int) -> int:
        """Where the pending input begins, given that ``src`` ends in an incomplete frame at ``pos``.

        When that frame is the one body frame of a message whose publish and header frames are the
        last two events (taken from ``src`` after ``start``), the message is held back whole: those
        events are taken back, and the next read completes it as one fused message (publish runs
        take fused messages only; a 256 KiB read of 64 KiB bodies ends inside one nearly every time,
        and that message went the single-message way). Its header and publish frames come in again,
        about a hundred bytes more copied. Likewise a publish whose header frame is incomplete.
        Otherwise ``pos``.
        """
        if not events:
            return pos
        kind = src[pos]
        head: Any = events[-1]
        if kind == FRAME_HEADER:
            publish, head, frame_at = head, None, pos
        elif kind == FRAME_BODY and len(events) >= 2 and type(head) is HeaderFrame:
            publish = events[-2]
            frame_at = pos - (7 + 12 + len(head.properties) + 1)
        else:
            return pos
        if type(publish) is not MethodFrame or type(publish.method) is not Publish:
            return pos
        method, channel = publish.method, publish.channel
        if head is not None:
            # A body larger than one frame is never fused; held back anyway, a header's body size would
            # let the reader wait for that many bytes unparsed (input buffered without bound).
            if head.channel != channel or head.body_size > self.frame_max - FRAME_OVERHEAD:
                return pos
            if len(src) - pos >= 7 and _FRAME_HEAD.unpack_from(src, pos)[1:] != (channel, head.body_size):
                return pos  # a body in several frames (or on another channel): never fused
        # class and method ids, ticket, two short strings, the bits
        method_size = 4 + 2 + 1 + len(method.exchange.encode()) + 1 + len(method.routing_key.encode()) + 1
        method_at = frame_at - (7 + method_size + 1)
        if (method_at < start or _FRAME_HEAD.unpack_from(src, method_at) != (FRAME_METHOD, channel, method_size)
                or _U32.unpack_from(src, method_at + 7)[0] != _IDX_PUBLISH):
            return pos
        if head is None:
            del events[-1]
            self._need += pos - method_at  # (the rest of the header frame, from its publish frame on)
            return method_at
        if _FRAME_HEAD.unpack_from(src, frame_at)[:2] != (FRAME_HEADER, channel):
            return pos
        del events[-2:]
        self._need = pos + 7 + head.body_size + 1 - method_at
        self._held = True
        return method_at

    def _read_protocol_header(self, src: bytes) -> bytes:
        """Check the protocol header; return what follows it (empty while it is incomplete)."""
        head = src[:8]
        if head != PROTOCOL_HEADER[:len(head)]:
            # Wrong already in the first bytes: no need to wait for all eight.
            raise BadProtocolHeader(head)
        if len(head) < 8:
            self._pending += src
            self._need = 8
            return b""
        self.expect_protocol_header = False
        return src[8:]

    def _parse_compiled(self, src: bytes, events: list[FrameEvent], pos: int, stop: int) -> int:
        """``_parse`` with the hot frames split and decoded in C (``_cwire.scan``), from where the
        first scan (in ``feed``) stopped at ``pos``.

        The C loop stops at any frame it does not handle (a rare method, a property block not seen
        before, anything wrong or incomplete); ``_parse`` then handles exactly that stretch, so every
        error is raised by the same Python code on both paths.
        """
        end = len(src)
        scan = cwire.scan  # type: ignore[union-attr]
        max_payload = self.frame_max - FRAME_OVERHEAD
        while True:
            pos = self._parse(src, events, pos, stop)
            if stop == end or self.undecoded:
                return pos
            pos, stop = scan(src, pos, max_payload, events, _publish_cache, _decode_publish, valid_props)
            if pos == end:
                self._need = 7
                return pos

    def _parse(self, src: bytes, events: list[FrameEvent], pos: int = 0, end: int = -1) -> int:
        """Append the complete frames of ``src[pos:end]`` to ``events``; return the offset of the first
        unread byte (``end`` -1: to the end of ``src``).

        This loop runs for every frame a client sends, so the hot cases are inlined and ordered by
        frequency (body, method with basic.publish first, header), and globals are bound to locals.
        """
        if end < 0:
            end = len(src)
        max_payload = self.frame_max - FRAME_OVERHEAD
        head_unpack = _FRAME_HEAD.unpack_from
        u32_unpack = _U32.unpack_from
        header_unpack = _HEADER_HEAD.unpack_from
        fixed_props_len = FIXED_PROPS_LEN.get
        append = events.append
        tag_bits_unpack = _TAG_BITS.unpack_from
        publish_cache_get = _publish_cache.get
        body_frame, method_frame, header_frame, ack = BodyFrame, MethodFrame, HeaderFrame, Ack
        while end - pos >= 7:
            frame_type, channel, size = head_unpack(src, pos)
            if size > max_payload:
                raise AMQPConnectionError(
                    FRAME_ERROR, f"frame size {size + FRAME_OVERHEAD} exceeds frame_max {self.frame_max}")
            start = pos + 7
            fend = start + size  # offset of the frame-end octet
            if fend >= end:
                if frame_type not in _KNOWN_TYPES:
                    raise AMQPConnectionError(FRAME_ERROR, f"unknown frame type {frame_type}")
                self._need = fend + 1 - pos
                break
            if src[fend] != 0xCE:
                raise AMQPConnectionError(
                    FRAME_ERROR, f"frame end octet is 0x{src[fend]:02x}, expected 0xce (type {frame_type})")
            pos = fend + 1
            if frame_type == 3:  # body
                # A large frame's data is a view of ``src`` (immutable bytes), not a copy of it.
                append(body_frame(channel, src[start:fend] if size < BODY_VIEW_MIN
                                  else memoryview(src)[start:fend]))
            elif frame_type == 1:  # method
                index = u32_unpack(src, start)[0] if size >= 4 else -1
                if index == 0x003C0028:  # basic.publish
                    args = src[start + 4:fend]
                    method: Any = publish_cache_get(args) or _decode_publish(args)  # or an Ack, or pamqp's
                    fused = self._fuse_content(src, pos, end, channel, method, max_payload)
                    if fused is not None:
                        message, pos = fused
                        # joins the run of alike publishes just before it on this channel, if any
                        before: Any = events[-1] if events else None
                        kind = type(before)
                        if ((kind is ContentRun or kind is ContentMessage) and before.method is method
                                and before.channel == channel and before.properties == message.properties):
                            if kind is ContentRun:
                                before.bodies.append(message.body)
                            else:
                                events[-1] = ContentRun(channel, method, before.properties,
                                                        [before.body, message.body])
                        else:
                            append(message)
                        continue
                elif index == 0x003C0050 and size == 13:  # basic.ack
                    tag, bits = tag_bits_unpack(src, start + 4)
                    if bits & 1:
                        method = ack(tag, True)
                    else:  # joins the run of acks just before it on this channel, if any
                        last = events[-1] if events else None
                        if type(last) is AckRun and last.channel == channel:
                            last.tags.append(tag)
                        else:
                            append(AckRun(channel, [tag]))
                        continue
                else:
                    if self._budget <= 0:  # this frame and the rest wait for the next feed
                        self.undecoded = True
                        self._need = 0
                        return start - 7
                    self._budget -= 1 + (size >> 10)  # and one a KiB: tables cost by their size
                    try:
                        method = _decode_method(src, start, fend)
                    except AMQPChannelError as err:
                        if channel == 0:
                            raise AMQPConnectionError(err.reply_code, err.detail, err.class_id, err.method_id)
                        append(RefusedFrame(channel, err))
                        continue
                append(method_frame(channel, method))
            elif frame_type == 2:  # content header
                if size < 14:  # class id, weight, body size, property flags
                    raise AMQPConnectionError(FRAME_ERROR, f"content header of {size} bytes is too short")
                class_id, _weight, body_size = header_unpack(src, start)
                props_at = start + 12
                props = src[props_at:fend]
                props_len = fixed_props_len((src[props_at] << 8) | src[props_at + 1])
                if props_len is None:
                    # Publishers repeat their property blocks: a block seen before needs no walk.
                    if props not in valid_props:
                        refused = check_content_properties(src, props_at, fend, class_id)
                        if refused is not None:
                            append(RefusedFrame(channel, refused))
                            continue
                        if size <= VALID_PROPS_MAX_FRAME:
                            if len(valid_props) >= VALID_PROPS_MAX:
                                valid_props.clear()
                            valid_props.add(props)
                elif props_at + props_len != fend:
                    check_content_properties(src, props_at, fend, class_id)  # raises: sizes disagree
                append(header_frame(channel, class_id, body_size, props))
            elif frame_type == 8:  # heartbeat
                if channel != 0:
                    raise AMQPConnectionError(FRAME_ERROR, f"heartbeat frame on channel {channel}")
                if size != 0:
                    raise AMQPConnectionError(FRAME_ERROR, f"heartbeat frame with a {size}-byte payload")
                append(_HEARTBEAT_EVENT)
            else:
                raise AMQPConnectionError(FRAME_ERROR, f"unknown frame type {frame_type}")
        else:
            self._need = 7
        return pos


    @staticmethod
    def _fuse_content(src: bytes, pos: int, end: int, channel: int, method: Publish,
                      max_payload: int) -> tuple[ContentMessage, int] | None:
        """(publish + header + body event, offset after them) when both follow complete and valid."""
        if end - pos < 22:  # a header frame is at least 7 + 14 + 1 bytes
            return None
        frame_type, header_channel, size = _FRAME_HEAD.unpack_from(src, pos)
        if frame_type != 2 or header_channel != channel or size < 14 or size > max_payload:
            return None
        start = pos + 7
        fend = start + size
        if fend >= end or src[fend] != 0xCE:
            return None
        class_id, _weight, body_size = _HEADER_HEAD.unpack_from(src, start)
        if class_id != 60:
            return None
        props_at = start + 12
        props = src[props_at:fend]
        props_len = FIXED_PROPS_LEN.get((src[props_at] << 8) | src[props_at + 1])
        if props_len is None:
            if props not in valid_props:
                # A block not seen before (per-message ids, timestamps, headers): checked here so
                # that the message is fused all the same; anything wrong goes the general way.
                try:
                    if check_content_properties(src, props_at, fend, 60) is not None:
                        return None
                except AMQPConnectionError:
                    return None
                if size <= VALID_PROPS_MAX_FRAME:
                    if len(valid_props) >= VALID_PROPS_MAX:
                        valid_props.clear()
                    valid_props.add(props)
        elif props_at + props_len != fend:
            return None
        pos = fend + 1
        if body_size == 0:
            return ContentMessage(channel, method, props, b""), pos
        if end - pos < 8:
            return None
        frame_type, body_channel, size = _FRAME_HEAD.unpack_from(src, pos)
        if frame_type != 3 or body_channel != channel or size != body_size or size > max_payload:
            return None
        start = pos + 7
        fend = start + size
        if fend >= end or src[fend] != 0xCE:
            return None
        return ContentMessage(channel, method, props, src[start:fend]), fend + 1


# Arguments of basic.publish (ticket, exchange, routing key, bits) as sent -> the decoded method.
_PUBLISH_CACHE_MAX = 4096
_publish_cache: dict[bytes, Publish] = {}


def _decode_publish(args: bytes) -> Publish:
    """Decode (and cache) basic.publish arguments: short ticket, shortstr exchange, shortstr key, bits."""
    end = len(args)
    if end >= 5:
        key_at = 3 + args[2]
        if key_at < end:
            bits_at = key_at + 1 + args[key_at]
            if bits_at + 1 == end:
                bits = args[bits_at]
                try:
                    method = Publish(args[3:key_at].decode(), args[key_at + 1:bits_at].decode(),
                                     bits & 1 == 1, bits & 2 == 2)
                except UnicodeDecodeError:
                    pass
                else:
                    if len(_publish_cache) >= _PUBLISH_CACHE_MAX:
                        _publish_cache.clear()
                    _publish_cache[args] = method
                    return method
    raise _cannot_decode(Publish.name, Publish.index)


def _decode_method(src: bytes, start: int, fend: int) -> Any:
    """Decode the method whose payload is ``src[start:fend]``."""
    if fend - start < 4:
        raise AMQPConnectionError(FRAME_ERROR, f"method frame of {fend - start} bytes is too short")
    index = _U32.unpack_from(src, start)[0]
    pos = start + 4
    if index == _IDX_PUBLISH:
        return _decode_publish(src[pos:fend])
    if index == _IDX_ACK:
        if fend - pos != 9:
            raise _cannot_decode(Ack.name, index)
        return Ack(_U64.unpack_from(src, pos)[0], src[pos + 8] & 1 == 1)
    if index == _IDX_NACK:
        if fend - pos != 9:
            raise _cannot_decode(Nack.name, index)
        bits = src[pos + 8]
        return Nack(_U64.unpack_from(src, pos)[0], bits & 1 == 1, bits & 2 == 2)
    if index == _IDX_REJECT:
        if fend - pos != 9:
            raise _cannot_decode(Reject.name, index)
        return Reject(_U64.unpack_from(src, pos)[0], src[pos + 8] & 1 == 1)
    cls = _METHODS.get(index)
    if cls is None:
        class_id, method_id = index >> 16, index & 0xFFFF
        raise AMQPConnectionError(
            NOT_IMPLEMENTED, f"unknown method class {class_id} method {method_id}", class_id, method_id)
    try:
        return decode_arguments(cls, src, pos, fend)
    except FieldTableError as err:
        if err.too_deep:
            # Well-formed but refused, as an argument value RabbitMQ cannot use: a channel error.
            raise AMQPChannelError(PRECONDITION_FAILED, f"invalid {_amqp_name(cls.name)}: {err}",
                                   index >> 16, index & 0xFFFF) from None
        raise AMQPConnectionError(FRAME_ERROR, f"cannot decode {cls.name} arguments: {err}",
                                  index >> 16, index & 0xFFFF) from None
    except ValueError:  # truncated, bytes left over, a short string not UTF-8
        raise _cannot_decode(cls.name, index) from None
