"""The asyncio side of an MQTT connection: owns the socket and its one timer, drives the state
machine (``connection.MQTTConnection``) and writes its output once per turn of the loop."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from .connection import Effect, MQTTConnection, SetTimer

if TYPE_CHECKING:
    from ..wire.proxy_header import ProxyHeader
    from .sessions import MQTTSessions

WRITE_HIGH_WATER = 4 * 1024 * 1024


class MQTTProtocol(asyncio.Protocol):
    def __init__(self, sessions: MQTTSessions, forwarded: ProxyHeader | None = None) -> None:
        self.sessions = sessions
        self.forwarded = forwarded
        self.conn: MQTTConnection | None = None
        self.transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._flush_scheduled = False
        self._loop = asyncio.get_event_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)  # type: ignore[attr-defined]
        peer = transport.get_extra_info("peername")
        if self.forwarded is not None and self.forwarded.source:
            peer = self.forwarded.source
        conn = self.conn = self.sessions.new_connection(peer if isinstance(peer, tuple) else None)
        conn.wakeup = self._schedule_flush
        conn.start()
        self.pump()

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        if conn is not None:
            conn.receive_data(data)
            self.pump()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        conn = self.conn
        if conn is not None:
            conn.lost()
            self.sessions.forget(conn)

    def pause_writing(self) -> None:
        if self.conn is not None:
            self.conn.set_writable(False)

    def resume_writing(self) -> None:
        if self.conn is not None:
            self.conn.set_writable(True)

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self.pump)

    def pump(self) -> None:
        """Write the connection's output as one buffer, then carry out its effects."""
        self._flush_scheduled = False
        conn, transport = self.conn, self.transport
        if conn is None or transport is None:
            return
        out = conn.data_to_send()
        if out and not transport.is_closing():
            transport.write(out[0] if len(out) == 1 else b"".join(out))
        for effect in conn.take_effects():
            if type(effect) is SetTimer:
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
                if effect.delay > 0 and not transport.is_closing():
                    self._timer = self._loop.call_later(effect.delay, self._fire)
            elif effect is Effect.CLOSE:
                transport.close()
            elif transport.is_closing():
                continue
            elif effect is Effect.PAUSE_READING:
                transport.pause_reading()
            elif effect is Effect.RESUME_READING:
                transport.resume_reading()

    def _fire(self) -> None:
        self._timer = None
        if self.conn is not None:
            self.conn.timer_fired()
            self.pump()
