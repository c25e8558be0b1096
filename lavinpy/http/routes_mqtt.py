"""MQTT over WebSocket on the HTTP port (``/ws``, subprotocol ``mqtt``, as RabbitMQ's Web MQTT): the
WebSocket carries the bytes of one ``mqtt.connection.MQTTConnection``, driven as a TCP one is."""

from __future__ import annotations

import asyncio

from aiohttp import WSMsgType, web

from ..mqtt.transport import WRITE_HIGH_WATER, ConnectionDriver
from .context import MQTT_SESSIONS

__all__ = ["MQTT_SESSIONS", "add_routes", "mqtt_websocket"]

PATH = "/ws"


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
    if sessions is None:
        raise web.HTTPNotFound()
    ws = web.WebSocketResponse(protocols=("mqtt",), max_msg_size=sessions.config.mqtt_max_packet_size)
    await ws.prepare(request)
    peer = request.transport.get_extra_info("peername") if request.transport is not None else None
    if isinstance(peer, tuple) and request.remote and request.remote != peer[0]:
        peer = (request.remote, peer[1])  # a client forwarded by a trusted proxy
    driver = WebSocketDriver(ws)
    local = request.transport.get_extra_info("sockname") if request.transport is not None else None
    conn = sessions.new_connection(peer if isinstance(peer, tuple) else None,
                                   local if isinstance(local, tuple) else None)
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
