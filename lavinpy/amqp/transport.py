"""The asyncio side of a connection: owns the socket and the timers, drives the state machine.

Output is written once per input batch (and once per round of deliveries), as one buffer: uvloop
drains a buffer of many tiny pieces very slowly. The transport's 4 MiB high-water mark makes the
connection unwritable (no deliveries, no reading) until the buffer drains.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..wire.proxy_header import ProxyHeaderError, may_be_proxy_line, parse_proxy_line
from .connection import AMQPConnection
from .effects import CancelTimer, Effect, SetTimer, TimerKind

if TYPE_CHECKING:
    from .sessions import Sessions

WRITE_HIGH_WATER = 4 * 1024 * 1024


class AMQPProtocol(asyncio.Protocol):
    def __init__(self, sessions: Sessions, accept_proxy: Callable[[str], bool] | None = None) -> None:
        """``accept_proxy(host)``: whether a peer at ``host`` may start with a PROXY line (cluster members)."""
        self.sessions = sessions
        self.accept_proxy = accept_proxy
        self._proxy_pending: bytes | None = None  # the start of a possible PROXY line from a trusted peer
        # (client, local) addresses from a PROXY line: the connection's real peer, for listings.
        self.proxied: tuple[tuple[str, int], tuple[str, int] | None] | None = None
        self.conn: AMQPConnection | None = None
        self.transport: asyncio.Transport | None = None
        self._timers: dict[TimerKind, asyncio.TimerHandle] = {}
        self._loop = asyncio.get_event_loop()

    # --- asyncio.Protocol ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)  # type: ignore[attr-defined]
        peer = transport.get_extra_info("peername")
        if self.accept_proxy is not None and isinstance(peer, tuple) and self.accept_proxy(peer[0]):
            self._proxy_pending = b""
        conn = self.conn = AMQPConnection(self.sessions, peer if isinstance(peer, tuple) else None)
        conn.driver = self
        conn.start()
        self.pump()

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        assert conn is not None
        if self._proxy_pending is not None:
            data = self._take_proxy_line(conn, data)
            if not data:
                return
        conn.receive_data(data)
        self.pump()

    def _take_proxy_line(self, conn: AMQPConnection, data: bytes) -> bytes:
        """Strip the PROXY line a cluster member sends first; its client becomes the connection's peer.
        Anything else (a malformed line included) goes to the connection as it came."""
        pending = self._proxy_pending + data
        try:
            parsed = parse_proxy_line(pending) if may_be_proxy_line(pending) else False
        except ProxyHeaderError:
            parsed = False
        if parsed is None:  # incomplete
            self._proxy_pending = pending
            return b""
        self._proxy_pending = None
        if parsed is False:
            return pending
        header, used = parsed
        if header.source is not None:
            self.proxied = (header.source, header.destination)
            conn.peer_host = header.source[0]
            conn.name = f"{header.source[0]}:{header.source[1]}"
        return pending[used:]

    def connection_lost(self, exc: Exception | None) -> None:
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        if self.conn is not None:
            self.conn.lost()

    def pause_writing(self) -> None:
        if self.conn is not None:
            self.conn.set_writable(False)
            self.pump()

    def resume_writing(self) -> None:
        if self.conn is not None:
            self.conn.set_writable(True)
            self.pump()

    # --- ConnectionDriver -----------------------------------------------------------------------
    def pump(self) -> None:
        """Write the connection's queued output as one buffer, then carry out its effects."""
        conn = self.conn
        transport = self.transport
        if conn is None or transport is None:
            return
        out = conn.data_to_send()
        if out and not transport.is_closing():
            transport.write(out[0] if len(out) == 1 else b"".join(out))
        for effect in conn.take_effects():
            self._apply(effect, transport)

    def _apply(self, effect: Effect | SetTimer | CancelTimer, transport: asyncio.Transport) -> None:
        if type(effect) is SetTimer:
            old = self._timers.pop(effect.kind, None)
            if old is not None:
                old.cancel()
            if not transport.is_closing():
                self._timers[effect.kind] = self._loop.call_later(effect.delay, self._fire, effect.kind)
        elif type(effect) is CancelTimer:
            old = self._timers.pop(effect.kind, None)
            if old is not None:
                old.cancel()
        elif transport.is_closing():
            return
        elif effect is Effect.CLOSE:
            transport.close()
        elif effect is Effect.PAUSE_READING:
            transport.pause_reading()
        elif effect is Effect.RESUME_READING:
            transport.resume_reading()

    def _fire(self, kind: TimerKind) -> None:
        self._timers.pop(kind, None)
        if self.conn is not None:
            self.conn.timer_fired(kind)
            self.pump()
