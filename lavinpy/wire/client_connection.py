"""One AMQP 0-9-1 client connection as a state machine: bytes in, events out; the caller owns the socket.

``receive_data`` takes what the socket read and returns events (lavinpy.wire.client_events);
``data_to_send`` returns what to write. The connection answers what needs no decision by itself
(connection.tune, a broker's channel.close or connection.close, channel.flow); everything else is
the caller's: ``call`` sends a synchronous method and the next method of the expected kinds on that
channel comes back as a ``Reply``. Time is the caller's too: a timer calls ``tick`` every
``heartbeat_interval`` seconds, which queues a heartbeat when nothing else went out and says when
the broker has been silent for two heartbeats.

A frame that does not parse, or a method out of place, raises ClientProtocolError (the connection
is then closed, with a connection.close for the broker queued): a broken peer gives a clear error,
never a hang. The asyncio adapter (client_asyncio) and the blocking one (client_blocking) drive it;
hot paths may pack their own publishes and parse their own deliveries around it (``receive_method``
takes the frames they leave).
"""

from __future__ import annotations

import struct
from collections import deque
from typing import Any

from pamqp import commands, encode

from lavinpy.wire.client import (
    BASIC_ACK,
    BASIC_DELIVER,
    BASIC_NACK,
    BASIC_RETURN,
    WireError,
    decode_method,
    encode_shortstr,
    method_id,
    parse_ack,
    parse_deliver,
    parse_header,
    parse_return,
    publish_method_frame,
    split_frames,
)
from lavinpy.wire.client_events import (
    Blocked,
    ChannelClosed,
    ChannelFlow,
    Confirmed,
    ConnectionClosed,
    ConnectionOpened,
    ConsumerCancelled,
    Delivery,
    Event,
    MethodReceived,
    Reply,
    Returned,
    Unblocked,
)
from lavinpy.wire.constants import (
    COMMAND_INVALID,
    FRAME_BODY,
    FRAME_ERROR,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    INTERNAL_MECHANISM,
    PROTOCOL_HEADER,
    UNEXPECTED_FRAME,
)
from lavinpy.wire.frames import build_method
from lavinpy.wire.shortstr import fit_shortstr
from lavinpy.wire.writer import HEARTBEAT, basic_ack, basic_nack, content_frames, encoded_method_frame, method_frame

__all__ = ["ClientConnection", "ClientProtocolError", "MECHANISMS"]

MECHANISMS = ("PLAIN", "AMQPLAIN", "EXTERNAL", INTERNAL_MECHANISM)

# States of the connection.
AWAIT_START = "awaiting connection.start"
AWAIT_TUNE = "awaiting connection.tune"
AWAIT_OPEN_OK = "awaiting connection.open-ok"
OPEN = "open"
CLOSING = "closing"
CLOSED = "closed"

_U32 = struct.Struct(">I")
_TAG_BITS = struct.Struct(">QB")

DEFAULT_FRAME_MAX = 131072  # RabbitMQ's
DEFAULT_CHANNEL_MAX = 2047  # RabbitMQ's
MISSED_TICKS_DEAD = 4  # ticks come every half heartbeat: silent for two heartbeats is dead


class ClientProtocolError(WireError):
    """The broker sent bytes that are not AMQP 0-9-1, or a method out of place."""


class _Content:
    """A delivery, return or get-ok whose header and body frames are still arriving."""

    __slots__ = ("head", "properties", "parts", "left")

    def __init__(self, head: tuple[Any, ...]) -> None:
        self.head = head
        self.properties = b""
        self.parts: list[bytes] = []
        self.left = -1  # body bytes still to come; -1 until the header frame


class ClientConnection:
    """The client side of one AMQP 0-9-1 connection (see the module's text)."""

    def __init__(self, user: str = "guest", password: str = "guest", vhost: str = "/", *,
                 mechanism: str = "PLAIN", name: str = "", product: str = "lavinpy",
                 heartbeat: int | None = None, frame_max: int | None = None, channel_max: int | None = None,
                 capabilities: dict[str, bool] | None = None, mechanisms: tuple[str, ...] = ()) -> None:
        # mechanisms: several to choose from, the first the broker offers (a URI's auth_mechanism keys)
        self.mechanisms = mechanisms or (mechanism,)
        for each in self.mechanisms:
            if each not in MECHANISMS:
                raise ValueError(f"unsupported SASL mechanism {each!r} (one of {', '.join(MECHANISMS)})")
        self.user, self.password, self.vhost, self.mechanism = user, password, vhost, self.mechanisms[0]
        self.client_properties: dict[str, Any] = {
            "product": product,
            "capabilities": capabilities if capabilities is not None else {
                "publisher_confirms": True, "consumer_cancel_notify": True, "basic.nack": True,
                "connection.blocked": True, "authentication_failure_close": True},
        }
        if name:
            self.client_properties["connection_name"] = name
        self._want_heartbeat = heartbeat  # None: what the broker proposes; 0: none
        # None: ours (0: no limit of ours, the broker's)
        self._want_frame_max = DEFAULT_FRAME_MAX if frame_max is None else frame_max
        self._want_channel_max = DEFAULT_CHANNEL_MAX if channel_max is None else channel_max
        self.state = AWAIT_START
        self.server_properties: dict[str, Any] = {}
        self.frame_max = self._want_frame_max
        self.channel_max = self._want_channel_max
        self.heartbeat = 0
        self.blocked = False
        self.error: str | None = None  # why the connection ended, once it has
        self._buf = bytearray()
        self._out: list[bytes] = []
        self._channels: set[int] = set()  # open or opening
        self._closing: set[int] = set()  # we sent channel.close, waiting for close-ok
        self._live: set[int] = set()  # open and not closing, while the connection is open: the fast path's
        self._expected: dict[int, deque[tuple[type, ...]]] = {}
        self._content: dict[int, _Content] = {}
        self._confirm_tags: dict[int, int] = {}  # channel in confirm mode -> last publish's tag
        self._publish_frames: dict[tuple[int, str, str, bool], bytes] = {}
        self._close_reason: tuple[int, str, int, int] = (200, "", 0, 0)
        self._heard = False
        self._sent = False
        self._missed = 0

    # ------------------------------------------------------------------ bytes in and out

    def initiate(self) -> None:
        """Queue the protocol header (first thing on a new socket)."""
        self._write(PROTOCOL_HEADER)

    def data_to_send(self) -> bytes:
        """Everything queued for the broker since the last call (b"" when nothing)."""
        out, self._out = self._out, []
        if not out:
            return b""
        self._sent = True
        return out[0] if len(out) == 1 else b"".join(out)

    def _write(self, data: bytes) -> None:
        if self.state != CLOSED:
            self._out.append(data)

    @property
    def is_open(self) -> bool:
        return self.state == OPEN

    @property
    def is_closed(self) -> bool:
        return self.state == CLOSED

    def receive_data(self, data: bytes | bytearray) -> list[Event]:
        """The events in ``data`` (appended to what came before). Raises ClientProtocolError."""
        if self.state == CLOSED:
            return []
        self._heard = True
        buf = self._buf
        buf += data
        if self.state == AWAIT_START and buf[:4] == b"AMQP":
            if len(buf) < 8:
                return []
            self._fail(f"the broker refused the AMQP 0-9-1 protocol header (it speaks {bytes(buf[:8])!r})", 0)
        try:
            frames, used = split_frames(buf, self.frame_max if self.state == OPEN else 0)
        except WireError as e:
            self._fail(f"bad frame from the broker: {e}", FRAME_ERROR)
        del buf[:used]
        events: list[Event] = []
        live, contents, append = self._live, self._content, events.append
        try:
            for ftype, channel, payload in frames:
                # The per-message frames of live channels first, inline (the shovel's path); the
                # general methods below check everything again.
                if ftype == FRAME_BODY:
                    content = contents.get(channel)
                    if content is not None and content.left > 0 and channel in live:
                        content.parts.append(payload)
                        content.left -= len(payload)
                        if content.left <= 0:
                            self._content_done(channel, content, events)
                        continue
                elif ftype == FRAME_METHOD and channel in live and channel not in contents and len(payload) >= 4:
                    mid = _U32.unpack_from(payload)[0]
                    if mid == BASIC_DELIVER:
                        n = payload[4]
                        tag, redelivered, exchange, routing_key = parse_deliver(payload)
                        contents[channel] = _Content((BASIC_DELIVER, payload[5:5 + n].decode(errors="replace"), tag,
                                                      redelivered, exchange, routing_key))
                        continue
                    if mid in (BASIC_ACK, BASIC_NACK):
                        tag, bits = _TAG_BITS.unpack_from(payload, 4)
                        append(Confirmed(channel, tag, bool(bits & 1), mid == BASIC_NACK))
                        continue
                if self.state == CLOSED:
                    break
                if ftype == FRAME_METHOD:
                    self._method_frame(channel, payload, events)
                elif ftype in (FRAME_HEADER, FRAME_BODY):
                    self._content_frame(ftype, channel, payload, events)
                elif ftype != FRAME_HEARTBEAT:
                    self._fail(f"frame of unknown type {ftype} from the broker", FRAME_ERROR)
        except ClientProtocolError:
            raise
        except (IndexError, ValueError, struct.error) as e:
            self._fail(f"truncated frame from the broker: {e}", FRAME_ERROR)
        return events

    def receive_method(self, channel: int, payload: bytes) -> list[Event]:
        """One method frame's payload that a caller's own frame parser passed on."""
        self._heard = True
        events: list[Event] = []
        if self.state != CLOSED:
            self._method_frame(channel, payload, events)
        return events

    def _fail(self, text: str, reply_code: int) -> None:
        """End the connection over a protocol error: tell the broker (when it can listen) and raise."""
        if reply_code and self.state != CLOSED:
            self._write(method_frame(0, commands.Connection.Close(
                reply_code=reply_code, reply_text=fit_shortstr(text), class_id=0, method_id=0)))
        self._end(text)
        raise ClientProtocolError(text)

    def _end(self, text: str) -> None:
        if self.error is None:
            self.error = text
        self.state = CLOSED
        self._live.clear()
        self._expected.clear()
        self._content.clear()

    # ------------------------------------------------------------------ frames from the broker

    def _method_frame(self, channel: int, payload: bytes, events: list[Event]) -> None:
        if len(payload) < 4:
            self._fail("method frame shorter than its ids", FRAME_ERROR)
        mid = method_id(payload)
        if channel and self.state != CLOSING:
            if channel in self._closing:
                if mid == 0x140028:  # both sides closed at once: the broker's close is answered too
                    self._write(method_frame(channel, commands.Channel.CloseOk()))
                if mid in (0x140028, 0x140029):  # close-ok: anything else in flight is dropped
                    self._channel_gone(channel)
                    events.append(Reply(channel, commands.Channel.CloseOk()))
                return
            if channel not in self._channels:
                self._fail(f"method {mid >> 16}.{mid & 0xFFFF} on channel {channel}, which is not open",
                           COMMAND_INVALID)
            if channel in self._content:
                self._fail(f"method on channel {channel} in the middle of a message's content", UNEXPECTED_FRAME)
            try:
                if mid == BASIC_DELIVER:
                    tag, redelivered, exchange, routing_key = parse_deliver(payload)
                    self._content[channel] = _Content(
                        (BASIC_DELIVER, payload[5:5 + payload[4]].decode(errors="replace"), tag, redelivered,
                         exchange, routing_key))
                    return
                if mid in (BASIC_ACK, BASIC_NACK):
                    tag, multiple = parse_ack(payload)
                    events.append(Confirmed(channel, tag, multiple, mid == BASIC_NACK))
                    return
                if mid == BASIC_RETURN:
                    self._content[channel] = _Content((BASIC_RETURN, *parse_return(payload)))
                    return
            except (IndexError, ValueError, struct.error) as e:
                self._fail(f"truncated method {mid >> 16}.{mid & 0xFFFF}: {e}", FRAME_ERROR)
        try:
            method = decode_method(payload)
        except WireError as e:
            self._fail(f"cannot decode a method from the broker: {e}", FRAME_ERROR)
        if channel:
            self._channel_method(channel, method, events)
        else:
            self._connection_method(method, events)

    def _connection_method(self, method: Any, events: list[Event]) -> None:
        state = self.state
        if isinstance(method, commands.Connection.Close):
            self._write(method_frame(0, commands.Connection.CloseOk()))
            text = f"connection closed by the broker: {method.reply_code} {method.reply_text}"
            self._end(text)
            events.append(ConnectionClosed(method.reply_code or 0, method.reply_text or "", method.class_id or 0,
                                           method.method_id or 0, True))
        elif state == CLOSING:
            if isinstance(method, commands.Connection.CloseOk):
                self._end("connection closed")
                code, text, class_id, mid = self._close_reason
                events.append(ConnectionClosed(code, text, class_id, mid, False))
            # after our close, everything else is discarded (the spec says so)
        elif isinstance(method, commands.Connection.Start) and state == AWAIT_START:
            self._on_start(method)
        elif isinstance(method, commands.Connection.Tune) and state == AWAIT_TUNE:
            self._on_tune(method)
        elif isinstance(method, commands.Connection.OpenOk) and state == AWAIT_OPEN_OK:
            self.state = OPEN
            events.append(ConnectionOpened(self.server_properties, self.channel_max, self.frame_max,
                                           self.heartbeat))
        elif isinstance(method, commands.Connection.Blocked) and state == OPEN:
            self.blocked = True
            events.append(Blocked(method.reason or ""))
        elif isinstance(method, commands.Connection.Unblocked) and state == OPEN:
            self.blocked = False
            events.append(Unblocked())
        else:
            self._fail(f"unexpected {method.name} from the broker while {state}", UNEXPECTED_FRAME)

    def _on_start(self, start: commands.Connection.Start) -> None:
        self.server_properties = dict(start.server_properties or {})
        offered = (start.mechanisms or "").split()
        # The internal mechanism is never advertised: the node accepts it from its own host only.
        usable = [each for each in self.mechanisms if each == INTERNAL_MECHANISM or each in offered]
        if not usable:
            self._fail(f"the broker does not offer SASL {' or '.join(self.mechanisms)} (it offers "
                       f"{' '.join(offered)})", 0)
        else:
            self.mechanism = usable[0]
        if self.mechanism == "AMQPLAIN":  # a field table without its length
            response = encode.field_table({"LOGIN": self.user, "PASSWORD": self.password})[4:]
        elif self.mechanism == "EXTERNAL":  # the identity is the TLS client certificate's
            response = b""
        else:  # PLAIN, and the internal one: the user and the node's token in its place
            response = b"\0" + self.user.encode() + b"\0" + self.password.encode()
        start_ok = commands.Connection.StartOk(client_properties=self.client_properties, mechanism=self.mechanism,
                                               response="", locale="en_US")
        # pamqp takes the response as text; SASL responses are bytes (AMQPLAIN's table), so the
        # empty long string pamqp packs before the locale is replaced by the real one.
        payload = start_ok.marshal()
        tail = len(encode_shortstr("en_US"))
        payload = payload[:-tail - 4] + len(response).to_bytes(4, "big") + response + payload[-tail:]
        self._write(encoded_method_frame(0, start_ok.index, payload))
        self.state = AWAIT_TUNE

    def _on_tune(self, tune: commands.Connection.Tune) -> None:
        def lower(ours: int, theirs: int) -> int:  # 0 is "no limit" on either side
            return min(ours, theirs) if ours and theirs else ours or theirs
        self.channel_max = lower(self._want_channel_max, tune.channel_max) or DEFAULT_CHANNEL_MAX
        self.frame_max = lower(self._want_frame_max, tune.frame_max) or DEFAULT_FRAME_MAX
        want = self._want_heartbeat
        self.heartbeat = tune.heartbeat if want is None else lower(want, tune.heartbeat) if want else 0
        self._write(method_frame(0, commands.Connection.TuneOk(
            channel_max=self.channel_max, frame_max=self.frame_max, heartbeat=self.heartbeat)))
        self._write(method_frame(0, build_method(commands.Connection.Open, virtual_host=self.vhost)))
        self.state = AWAIT_OPEN_OK

    def _channel_method(self, channel: int, method: Any, events: list[Event]) -> None:
        if self.state == CLOSING:
            return
        if isinstance(method, commands.Channel.Close):
            self._write(method_frame(channel, commands.Channel.CloseOk()))
            self._channel_gone(channel)
            events.append(ChannelClosed(channel, method.reply_code or 0, method.reply_text or "",
                                        method.class_id or 0, method.method_id or 0))
            return
        if isinstance(method, commands.Channel.Flow):
            self._write(method_frame(channel, commands.Channel.FlowOk(active=method.active)))
            events.append(ChannelFlow(channel, bool(method.active)))
            return
        if isinstance(method, commands.Basic.Cancel):  # the broker's notice: not answered (no_wait)
            events.append(ConsumerCancelled(channel, method.consumer_tag or ""))
            return
        if isinstance(method, commands.Basic.GetOk):
            self._content[channel] = _Content((method,))
            return
        expected = self._expected.get(channel)
        if expected and isinstance(method, expected[0]):
            expected.popleft()
            events.append(Reply(channel, method))
        else:
            events.append(MethodReceived(channel, method))

    def _content_frame(self, ftype: int, channel: int, payload: bytes, events: list[Event]) -> None:
        if self.state == CLOSING or channel in self._closing:
            return
        content = self._content.get(channel)
        if content is None or (ftype == FRAME_HEADER) != (content.left < 0):
            kind = "content header" if ftype == FRAME_HEADER else "content body"
            self._fail(f"{kind} frame on channel {channel} out of place", UNEXPECTED_FRAME)
        assert content is not None
        if ftype == FRAME_HEADER:
            if len(payload) < 14:
                self._fail("content header frame too short", FRAME_ERROR)
            content.left, _flags = parse_header(payload)
            content.properties = payload[12:]
        else:
            content.parts.append(payload)
            content.left -= len(payload)
            if content.left < 0:
                self._fail(f"content body on channel {channel} longer than its header said", FRAME_ERROR)
        if content.left == 0:
            self._content_done(channel, content, events)

    def _content_done(self, channel: int, content: _Content, events: list[Event]) -> None:
        if content.left < 0:
            self._fail(f"content body on channel {channel} longer than its header said", FRAME_ERROR)
        del self._content[channel]
        parts = content.parts
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        head = content.head
        if head[0] == BASIC_DELIVER:
            events.append(Delivery(channel, head[1], head[2], head[3], head[4], head[5], content.properties, body))
        elif head[0] == BASIC_RETURN:
            events.append(Returned(channel, head[1], head[2], head[3], head[4], content.properties, body))
        else:
            expected = self._expected.get(channel)
            if expected and isinstance(head[0], expected[0]):
                expected.popleft()
                events.append(Reply(channel, head[0], content.properties, body))
            else:
                events.append(MethodReceived(channel, head[0]))

    def _channel_gone(self, channel: int) -> None:
        self._channels.discard(channel)
        self._closing.discard(channel)
        self._live.discard(channel)
        self._expected.pop(channel, None)
        self._content.pop(channel, None)
        self._confirm_tags.pop(channel, None)

    # ------------------------------------------------------------------ what the caller sends

    def _check_open(self) -> None:
        if self.state != OPEN:
            raise ClientProtocolError(f"the connection is {self.state}" + (f": {self.error}" if self.error else ""))

    def send_method(self, channel: int, method: Any) -> None:
        """Any method, no reply expected (nowait declares, basic.qos's peers, ...)."""
        self._check_open()
        self._write(method_frame(channel, method))

    def call(self, channel: int, method: Any, *expect: type) -> None:
        """A synchronous method: the next method of one of the ``expect`` kinds on ``channel`` comes
        back as a Reply (a basic.get-ok with its content)."""
        self._check_open()
        if channel not in self._channels or channel in self._closing:
            raise ClientProtocolError(f"channel {channel} is not open")
        self._expected.setdefault(channel, deque()).append(expect)
        self._write(method_frame(channel, method))

    def open_channel(self, channel: int = 0) -> int:
        """Open ``channel`` (0: the lowest free number); its channel.open-ok comes as a Reply."""
        self._check_open()
        if not channel:
            channel = next(n for n in range(1, self.channel_max + 2) if n not in self._channels)
        if channel in self._channels or not 0 < channel <= self.channel_max:
            raise ClientProtocolError(f"channel {channel} is in use or beyond channel_max {self.channel_max}")
        self._channels.add(channel)
        self._live.add(channel)
        self.call(channel, commands.Channel.Open(), commands.Channel.OpenOk)
        return channel

    def close_channel(self, channel: int, reply_code: int = 200, reply_text: str = "") -> None:
        """Close ``channel``; its close-ok comes as a Reply, and what arrives on it meanwhile is dropped."""
        self._check_open()
        if channel not in self._channels or channel in self._closing:
            return
        self._expected.pop(channel, None)
        self._content.pop(channel, None)
        self._closing.add(channel)
        self._live.discard(channel)
        self._write(method_frame(channel, commands.Channel.Close(
            reply_code=reply_code, reply_text=reply_text, class_id=0, method_id=0)))

    def confirm_select(self, channel: int) -> None:
        """Publisher confirms on ``channel``: ``publish`` returns each message's delivery tag from now on."""
        self.call(channel, commands.Confirm.Select(), commands.Confirm.SelectOk)
        self._confirm_tags[channel] = 0

    def publish(self, channel: int, exchange: str, routing_key: str, properties: bytes, body: bytes,
                mandatory: bool = False) -> int:
        """basic.publish with its content (``properties`` a packed property block); the message's
        delivery tag on a channel with confirms, else 0."""
        key = (channel, exchange, routing_key, mandatory)
        head = self._publish_frames.get(key)
        if head is None:
            if len(self._publish_frames) > 4096:
                self._publish_frames.clear()
            head = self._publish_frames[key] = publish_method_frame(channel, exchange, routing_key, mandatory)
        if self.state == OPEN:
            self._out.append(head)
            self._out.extend(content_frames(channel, properties, body, self.frame_max))
        tag = self._confirm_tags.get(channel)
        if tag is None:
            return 0
        self._confirm_tags[channel] = tag + 1
        return tag + 1

    def ack(self, channel: int, delivery_tag: int, multiple: bool = False) -> None:
        if self.state == OPEN:
            self._out.append(basic_ack(channel, delivery_tag, multiple))

    def nack(self, channel: int, delivery_tag: int, multiple: bool = False, requeue: bool = True) -> None:
        if self.state == OPEN:
            self._out.append(basic_nack(channel, delivery_tag, multiple, requeue))

    def close(self, reply_code: int = 200, reply_text: str = "", class_id: int = 0, method_id: int = 0) -> None:
        """Close the connection; a ConnectionClosed event comes with the broker's close-ok."""
        if self.state in (CLOSING, CLOSED):
            return
        if self.state != OPEN:  # mid-handshake there is nobody to say goodbye to
            self._end(reply_text or "closed during the handshake")
            return
        self._close_reason = (reply_code, reply_text, class_id, method_id)
        self._write(method_frame(0, commands.Connection.Close(
            reply_code=reply_code, reply_text=reply_text, class_id=class_id, method_id=method_id)))
        self.state = CLOSING
        self._live.clear()

    # ------------------------------------------------------------------ heartbeats

    @property
    def heartbeat_interval(self) -> float:
        """How often the caller's timer should call ``tick`` (0: heartbeats are off)."""
        return self.heartbeat / 2

    def note_sent(self) -> None:
        """Count something as gone out (the caller wrote frames of its own): no heartbeat is due."""
        self._sent = True

    def note_peer_alive(self) -> None:
        """Count the broker as heard from (the caller stopped reading on purpose: no verdict then)."""
        self._heard = True

    def tick(self) -> bool:
        """Every ``heartbeat_interval`` seconds: queue a heartbeat when nothing else went out since the
        last tick; True (and the connection closed) when the broker has been silent for two heartbeats."""
        if not self.heartbeat or self.state == CLOSED:
            return False
        if self._heard:
            self._missed = 0
        else:
            self._missed += 1
            if self._missed >= MISSED_TICKS_DEAD:
                silent = self._missed * self.heartbeat_interval
                self._end(f"missed heartbeats from the broker (silent for {silent:g} s)")
                return True
        self._heard = False
        if not self._sent and not self._out:
            self._out.append(HEARTBEAT)
        self._sent = False
        return False

