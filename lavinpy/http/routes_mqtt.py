"""MQTT over WebSocket on the HTTP port (``/ws``, subprotocol ``mqtt``, as RabbitMQ's Web MQTT): the
WebSocket carries the bytes of one ``mqtt.connection.MQTTConnection``, driven as a TCP one is.

Served only while MQTT is on (``mqtt_port`` not 0). Until the client has logged in, a WebSocket
message may be no larger than an MQTT packet before CONNECT (64 KiB, as over TCP): ``PreLoginGate``
reads the frame headers in front of aiohttp's reader and refuses a larger message at its first header,
before its payload is buffered; once logged in, a message may be as large as ``mqtt_max_packet_size``.
No compression is offered (permessage-deflate is negotiated at the handshake, before any login, and
inflating is what lets a few bytes on the wire cost the server megabytes)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web, web_ws
from aiohttp.http_websocket import WebSocketError

from ..broker.ops import peer_certificate
from ..mqtt.connection import MAX_PACKET_BEFORE_CONNECT
from ..mqtt.sessions import MQTTSessions
from ..mqtt.transport import WRITE_HIGH_WATER, ConnectionDriver

# The MQTT sessions the /ws route hands its connections to: set by the server when it runs MQTT.
MQTT_SESSIONS: web.AppKey[MQTTSessions] = web.AppKey("mqtt_sessions")

__all__ = ["MQTT_SESSIONS", "add_routes", "mqtt_websocket"]

PATH = "/ws"
_READER = web_ws.WebSocketReader  # aiohttp's frame reader, which the gate stands in front of
_EMPTY, _REFUSED = (False, b""), (True, b"")  # a reader's answers to input: (end of input, unread tail)


class PreLoginGate:
    """Stands in front of aiohttp's WebSocket reader (which it passes every byte to) and, until
    ``opened``, refuses a data message larger than ``limit`` at the header of the frame that makes it
    so, before the payload is buffered anywhere. Control frames (ping, pong, close) do not count.
    It refuses an unmasked frame at any time."""

    def __init__(self, reader: Any, queue: Any, limit: int, opened_limit: int) -> None:
        self.reader = reader
        self.queue = queue
        self.limit = limit
        self.opened_limit = opened_limit
        self.opened = False
        self.refused = False
        self._head = bytearray()  # the current frame header, while incomplete
        self._payload_left = 0  # bytes of the current frame's payload not seen yet
        self._message = 0  # bytes of the current data message so far

    def feed_eof(self) -> None:
        self.reader.feed_eof()

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        if self.refused:
            return _REFUSED  # nothing more is read
        refusal = self._scan(data)
        if refusal is not None:
            self.queue.set_exception(WebSocketError(*refusal))
            self.refused = True
            return _REFUSED
        result: tuple[bool, bytes] = self.reader.feed_data(data)
        return result

    def _scan(self, data: bytes) -> tuple[WSCloseCode, str] | None:
        """Follow the frames of ``data``: the close code and reason of the first frame refused, else
        None. A client's frames must be masked (RFC 6455 5.1: aiohttp's reader takes unmasked ones);
        before login, a data message may not grow past the limit."""
        pos, end, head = 0, len(data), self._head
        while pos < end:
            if self._payload_left:
                step = min(self._payload_left, end - pos)
                self._payload_left -= step
                pos += step
                continue
            take = min(end - pos, 14 - len(head))
            head += data[pos:pos + take]
            if len(head) < 2:
                return None
            short = head[1] & 0x7F
            size = 2 + (2 if short == 126 else 8 if short == 127 else 0) + (4 if head[1] & 0x80 else 0)
            if len(head) < size:
                return None
            pos += take - (len(head) - size)
            length = short if short < 126 else int.from_bytes(head[2:4 if short == 126 else 10], "big")
            opcode, fin, masked = head[0] & 0x0F, head[0] & 0x80, head[1] & 0x80
            del head[:]
            if not masked:
                return WSCloseCode.PROTOCOL_ERROR, "an unmasked frame from the client"
            if opcode < 8:  # a data frame or a continuation of one
                self._message += length
                if self._message > (self.opened_limit if self.opened else self.limit):
                    if self.opened:
                        return WSCloseCode.MESSAGE_TOO_BIG, f"a message over {self.opened_limit} bytes"
                    return WSCloseCode.MESSAGE_TOO_BIG, f"a message over {self.limit} bytes before CONNECT"
                if fin:
                    self._message = 0
            self._payload_left = length
        return None


class MQTTWebSocketResponse(web.WebSocketResponse):
    """A WebSocket whose frame reader is behind a ``PreLoginGate`` from its first byte on."""

    gate: PreLoginGate | None = None

    def _post_start(self, *args: Any, **kwargs: Any) -> None:
        def gated_reader(queue: Any, max_msg_size: int, *rest: Any, **options: Any) -> PreLoginGate:
            self.gate = PreLoginGate(_READER(queue, max_msg_size, *rest, **options), queue,
                                     MAX_PACKET_BEFORE_CONNECT, max_msg_size)
            return self.gate

        # aiohttp makes its reader in _post_start, by this name, and hands it the input read so far;
        # nothing else runs meanwhile (no await in between).
        web_ws.WebSocketReader = gated_reader  # type: ignore[assignment]
        try:
            super()._post_start(*args, **kwargs)
        finally:
            web_ws.WebSocketReader = _READER
        if self.gate is None:
            raise RuntimeError("aiohttp made its WebSocket reader elsewhere: MQTT over WebSocket cannot limit it")


class WebSocketDriver(ConnectionDriver):
    """The connection's output goes out as binary messages from one sending task (a send waits for the
    socket to drain; past the high-water mark the connection is told it is not writable)."""

    def __init__(self, ws: web.WebSocketResponse) -> None:
        super().__init__()
        self.ws = ws
        self._out: list[bytes] = []
        self._pending = 0
        self._wake = asyncio.Event()
        self.readable = asyncio.Event()
        self.readable.set()
        self._closing = False

    def write(self, data: bytes) -> None:
        self._out.append(data)
        self._pending += len(data)
        self._wake.set()
        conn = self.conn
        if self._pending > WRITE_HIGH_WATER and conn is not None and conn.writable:
            conn.set_writable(False)

    def close(self) -> None:
        self._closing = True
        self._wake.set()

    def closing(self) -> bool:
        return self._closing or self.ws.closed

    def pump(self) -> None:
        super().pump()
        gate = self.ws.gate if isinstance(self.ws, MQTTWebSocketResponse) else None
        if gate is not None and not gate.opened and self.conn is not None and self.conn.connected:
            gate.opened = True  # logged in: messages up to mqtt_max_packet_size

    def set_reading(self, paused: bool) -> None:
        if paused:
            self.readable.clear()
        else:
            self.readable.set()

    async def send_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            out, self._out, self._pending = self._out, [], 0
            if out and not self.ws.closed:
                await self.ws.send_bytes(b"".join(out))
            conn = self.conn
            if conn is not None and not conn.writable:
                conn.set_writable(True)
                self.pump()
            if self._closing:
                await self.ws.close()
                return


async def mqtt_websocket(request: web.Request) -> web.StreamResponse:
    sessions = request.app.get(MQTT_SESSIONS)
    if sessions is None or not sessions.config.mqtt_port:  # MQTT is off
        raise web.HTTPNotFound()
    ws = MQTTWebSocketResponse(protocols=("mqtt",), max_msg_size=sessions.config.mqtt_max_packet_size,
                               compress=False)
    await ws.prepare(request)
    peer = request.transport.get_extra_info("peername") if request.transport is not None else None
    if isinstance(peer, tuple) and request.remote and request.remote != peer[0]:
        peer = (request.remote, peer[1])  # a client forwarded by a trusted proxy
    driver = WebSocketDriver(ws)
    local = request.transport.get_extra_info("sockname") if request.transport is not None else None
    conn = sessions.new_connection(peer if isinstance(peer, tuple) else None,
                                   local if isinstance(local, tuple) else None)
    if request.transport is not None:  # WebSocket over HTTPS: the client's verified certificate
        conn.peer_certificate = peer_certificate(request.transport.get_extra_info("ssl_object"))
    sender = asyncio.get_running_loop().create_task(driver.send_loop())
    driver.attach(conn)
    try:
        async for message in ws:
            if message.type != WSMsgType.BINARY:
                break  # MQTT over WebSocket is binary messages only
            driver.received(message.data)
            await driver.readable.wait()
            if driver.closing():
                break
    finally:
        # The response outlives the connection in a reference cycle, freed only by a full collection
        # (rare at the server's GC thresholds); through the gate it held aiohttp's reader and so the
        # fragments of an unfinished message, up to mqtt_max_packet_size per connection.
        ws.gate = None
        driver.ended()
        sessions.forget(conn)
        driver.close()
        try:
            await asyncio.wait_for(sender, 5)
        except (TimeoutError, ConnectionError):
            pass
    return ws


def add_routes(app: web.Application) -> None:
    app.router.add_get(PATH, mqtt_websocket)
