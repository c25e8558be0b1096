"""A tiny blocking raw-socket AMQP 0-9-1 client for tests that must send what real clients never do.

Frames are built and parsed with the shared codec (lavinpy.wire), over the network only; received
frames are handed to tests as pamqp objects. Everything is explicit: the test decides which bytes go
out and checks every frame that comes back.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from pamqp import commands, constants, header, heartbeat
from pamqp.body import ContentBody

from lavinpy.wire import writer
from lavinpy.wire.client import FRAME_HEAD, WireError, decode_method, split_frames
from lavinpy.wire.constants import CLASS_BASIC, FRAME_BODY, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD, PROTOCOL_HEADER
from lavinpy.wire.field_table import encode_table
from lavinpy.wire.properties import PropertiesError, decode_properties, encode_properties

CLIENT_PROPERTIES: dict[str, Any] = {
    "product": "lavinpy-e2e-rawamqp",
    "capabilities": {
        "authentication_failure_close": True,
        "basic.nack": True,
        "consumer_cancel_notify": True,
        "publisher_confirms": True,
        "connection.blocked": True,
    },
}


class PeerClosed(Exception):
    """The server closed the TCP connection."""


def raw_frame(frame_type: int, channel: int, payload: bytes, end: bytes = b"\xce") -> bytes:
    """A frame with any type, channel, payload and frame-end byte (for malformed input)."""
    return FRAME_HEAD.pack(frame_type, channel, len(payload)) + payload + end


def method_payload(class_id: int, method_id: int, args: bytes = b"") -> bytes:
    return ((class_id << 16) | method_id).to_bytes(4, "big") + args


def amqplain_response(user: str, password: str) -> str:
    """An AMQPLAIN response: a field table without its 4-byte length prefix."""
    encoded = encode_table({"LOGIN": user, "PASSWORD": password})
    return encoded[4:].decode("latin-1")


def _frame_value(frame_type: int, payload: bytes) -> Any:
    """A received frame as the pamqp object tests compare against."""
    if frame_type == FRAME_METHOD:
        return decode_method(payload)
    if frame_type == FRAME_HEADER:
        if len(payload) < 14:
            raise WireError(f"content header of {len(payload)} bytes")
        class_id = int.from_bytes(payload[:2], "big")
        if class_id != CLASS_BASIC:
            raise WireError(f"content header of class {class_id}")
        return header.ContentHeader(int.from_bytes(payload[2:4], "big"), int.from_bytes(payload[4:12], "big"),
                                    decode_properties(payload[12:]))
    if frame_type == FRAME_BODY:
        return ContentBody(payload)
    if frame_type == FRAME_HEARTBEAT and not payload:
        return heartbeat.Heartbeat()
    raise WireError(f"frame type {frame_type}")


class RawAMQP:
    """One TCP connection to the broker, driven frame by frame."""

    def __init__(self, host: str, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.buf = b""
        self.start: commands.Connection.Start | None = None
        self.tune: commands.Connection.Tune | None = None
        self.frame_max = 131072
        self.heartbeats_seen = 0
        self.frames_seen: list[tuple[int, Any, int]] = []  # (channel, frame, wire size)
        self.name = ""  # free for the test's use (e.g. a unique object name)

    # --- sending ---------------------------------------------------------------------------------

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, channel: int, value: Any) -> None:
        """Send a pamqp method, content header, content body or heartbeat, encoded by lavinpy.wire."""
        if isinstance(value, header.ContentHeader):
            head = CLASS_BASIC.to_bytes(2, "big") + bytes(2) + value.body_size.to_bytes(8, "big")  # weight 0
            data = raw_frame(FRAME_HEADER, channel, head + encode_properties(value.properties))
        elif isinstance(value, ContentBody):
            data = raw_frame(FRAME_BODY, channel, value.value)
        elif isinstance(value, heartbeat.Heartbeat):
            data = writer.HEARTBEAT
        else:
            data = writer.method_frame(channel, value)
        self.sock.sendall(data)

    def send_heartbeat(self) -> None:
        self.sock.sendall(writer.HEARTBEAT)

    def content_frames(
        self, channel: int, body: bytes, properties: commands.Basic.Properties | None = None
    ) -> bytes:
        raw = encode_properties(properties or commands.Basic.Properties())
        return b"".join(writer.content_frames(channel, raw, body, self.frame_max))

    def publish(
        self,
        channel: int,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: commands.Basic.Properties | None = None,
        mandatory: bool = False,
        immediate: bool = False,
    ) -> None:
        method = commands.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=mandatory,
                                        immediate=immediate)
        self.sock.sendall(writer.method_frame(channel, method) + self.content_frames(channel, body, properties))

    # --- receiving -------------------------------------------------------------------------------

    def _fill(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no frame from the server in time")
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            raise TimeoutError("no frame from the server in time")
        except ConnectionResetError:
            data = b""
        if not data:
            raise PeerClosed(f"server closed the connection (unparsed bytes: {self.buf[:64]!r})")
        self.buf += data

    def recv_bytes(self, n: int, timeout: float | None = None) -> bytes:
        """Exactly n raw bytes (or fewer if the server closes first)."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while len(self.buf) < n:
            try:
                self._fill(deadline)
            except PeerClosed:
                break
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def recv(self, timeout: float | None = None) -> tuple[int, Any]:
        """The next frame as (channel, pamqp object); heartbeats are returned too."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            try:
                frames, _used = split_frames(self.buf[:FRAME_HEAD.size + 1 + self._next_frame_size()])
                if frames:
                    frame_type, channel, payload = frames[0]
                    value = _frame_value(frame_type, payload)
            except (WireError, PropertiesError) as e:
                raise AssertionError(f"server sent a malformed frame: {self.buf[:64]!r}: {e}")
            if frames:
                used = len(payload) + 8
                self.frames_seen.append((channel, value, used))
                self.buf = self.buf[used:]
                if isinstance(value, heartbeat.Heartbeat):
                    self.heartbeats_seen += 1
                return channel, value
            self._fill(deadline)

    def _next_frame_size(self) -> int:
        return FRAME_HEAD.unpack_from(self.buf)[2] if len(self.buf) >= FRAME_HEAD.size else 0

    def expect(self, cls: type, channel: int | None = None, timeout: float | None = None) -> Any:
        """The next non-heartbeat frame, which must be an instance of cls (on channel, if given)."""
        while True:
            ch, value = self.recv(timeout)
            if isinstance(value, heartbeat.Heartbeat):
                continue
            if not isinstance(value, cls):
                raise AssertionError(f"expected {cls.__name__}, got {value!r} on channel {ch}")
            if channel is not None and ch != channel:
                raise AssertionError(f"expected {cls.__name__} on channel {channel}, got it on {ch}")
            return value

    def expect_connection_close(self, timeout: float | None = None) -> commands.Connection.Close:
        """Skip frames until connection.close arrives; answer close-ok; the socket must then close."""
        while True:
            ch, value = self.recv(timeout)
            if isinstance(value, commands.Connection.Close):
                assert ch == 0, "connection.close must come on channel 0"
                try:
                    self.send(0, commands.Connection.CloseOk())
                except OSError:
                    pass
                assert self.wait_closed(timeout or self.timeout), "socket still open after close-ok"
                return value

    def expect_channel_close(self, channel: int, timeout: float | None = None) -> commands.Channel.Close:
        """Skip frames until channel.close arrives on channel; answer close-ok."""
        while True:
            ch, value = self.recv(timeout)
            if isinstance(value, commands.Connection.Close):
                raise AssertionError(f"expected channel.close on {channel}, got connection close {value!r}")
            if isinstance(value, commands.Channel.Close) and ch == channel:
                self.send(channel, commands.Channel.CloseOk())
                return value

    def wait_closed(self, timeout: float) -> bool:
        """True once the server has closed the TCP connection (unread data is discarded)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                return False
            except (ConnectionResetError, OSError):
                return True
            if not data:
                return True
        return False

    # --- handshake -------------------------------------------------------------------------------

    def handshake(
        self,
        user: str = "guest",
        password: str = "guest",
        vhost: str = "/",
        mechanism: str = "PLAIN",
        heartbeat_s: int = 0,
        frame_max: int | None = None,
        channel_max: int | None = None,
        open_vhost: bool = True,
    ) -> None:
        self.send_raw(PROTOCOL_HEADER)
        self.start = self.expect(commands.Connection.Start, 0)
        if mechanism == "AMQPLAIN":
            response = amqplain_response(user, password)
        else:
            response = f"\0{user}\0{password}"
        self.send(0, commands.Connection.StartOk(client_properties=CLIENT_PROPERTIES, mechanism=mechanism,
                                                 response=response, locale="en_US"))
        self.tune = self.expect(commands.Connection.Tune, 0)
        cm = self.tune.channel_max if channel_max is None else channel_max
        fm = self.tune.frame_max if frame_max is None else frame_max
        self.frame_max = fm
        self.send(0, commands.Connection.TuneOk(channel_max=cm, frame_max=fm, heartbeat=heartbeat_s))
        if open_vhost:
            self.send(0, commands.Connection.Open(virtual_host=vhost))
            self.expect(commands.Connection.OpenOk, 0)

    def open_channel(self, channel: int = 1) -> None:
        self.send(channel, commands.Channel.Open())
        self.expect(commands.Channel.OpenOk, channel)

    def call(self, channel: int, method: Any, reply_cls: type) -> Any:
        self.send(channel, method)
        return self.expect(reply_cls, channel)

    def get_message(self, channel: int, queue: str, no_ack: bool = True
                    ) -> tuple[commands.Basic.GetOk, header.ContentHeader, bytes] | None:
        """basic.get; None on get-empty, else (get-ok, content header, body)."""
        self.send(channel, commands.Basic.Get(queue=queue, no_ack=no_ack))
        while True:
            ch, value = self.recv()
            if isinstance(value, heartbeat.Heartbeat):
                continue
            if isinstance(value, commands.Basic.GetEmpty):
                return None
            if isinstance(value, commands.Basic.GetOk):
                break
            raise AssertionError(f"expected get-ok or get-empty, got {value!r} on {ch}")
        hdr = self.expect(header.ContentHeader, channel)
        body = b""
        while len(body) < hdr.body_size:
            body += self.expect(ContentBody, channel).value
        return value, hdr, body

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> RawAMQP:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "CLIENT_PROPERTIES",
    "FRAME_BODY",
    "FRAME_HEADER",
    "FRAME_HEARTBEAT",
    "FRAME_METHOD",
    "PROTOCOL_HEADER",
    "PeerClosed",
    "RawAMQP",
    "amqplain_response",
    "commands",
    "constants",
    "method_payload",
    "raw_frame",
]
