"""The asyncio side of an MQTT connection: owns the socket and its one timer, drives the state
machine (``connection.MQTTConnection``) and writes its output once per turn of the model's
scheduler (``broker.scheduler``: after the deliveries of the turn, with every other face's output).

``ConnectionDriver`` is the part every carrier shares (the output flush, the timer, the effects);
``MQTTProtocol`` carries MQTT over TCP (and TLS), the HTTP face's WebSocket route over WebSocket."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..broker.ops import peer_certificate
from .connection import MQTTConnection
from .effects import Effect, SetTimer

if TYPE_CHECKING:
    from ..wire.proxy_header import ProxyHeader
    from .sessions import MQTTSessions

WRITE_HIGH_WATER = 4 * 1024 * 1024
LINGER_SECONDS = 5.0  # how long a connection the server ended reads (and drops) what the client still sends


class ConnectionDriver:
    """Runs one ``MQTTConnection``: its output written once per turn of the loop, its timer, its effects."""

    def __init__(self) -> None:
        self.conn: MQTTConnection | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._flush_scheduled = False
        self._schedule: Callable[[ConnectionDriver], None] = lambda driver: None  # set by attach
        self._loop = asyncio.get_event_loop()

    # --- the carrier's side -------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def set_reading(self, paused: bool) -> None:
        raise NotImplementedError

    def closing(self) -> bool:
        raise NotImplementedError

    # --- shared -------------------------------------------------------------------------------------
    def attach(self, conn: MQTTConnection) -> None:
        self.conn = conn
        self._schedule = conn.broker.scheduler.schedule  # the model's turns write the output
        conn.wakeup = self._schedule_flush
        conn.start()
        self.pump()

    def received(self, data: bytes) -> None:
        conn = self.conn
        if conn is None:
            return
        scheduler = conn.broker.scheduler
        held = scheduler.hold()  # no turn of the loop asked for what is done and written here
        self._flush_scheduled = True  # the pump below writes this connection's output
        try:
            # A subscriber's PUBACKs free its window at once; their queue-side acks wait for the write
            # (settle_deferred below): the client's next deliveries go out before that bookkeeping.
            conn.receive_data(data, True)
            if scheduler.queues:
                # What this input made deliverable (a PUBACK freeing window room, publishes) goes out
                # in this turn of the loop, not two turns later: an in-flight window's round trip.
                scheduler.run_deliveries()
            self.pump()
        finally:
            if self._flush_scheduled:  # the pump did not run (a bug raised): a turn writes the output
                self._schedule(self)
            conn.settle_deferred()
            scheduler.release(held)  # a turn for what is left: other connections' output, deliveries

    def ended(self) -> None:
        """The carrier is gone: the connection's unclean end (if it did not end already)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        conn = self.conn
        if conn is not None:
            conn.lost()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._schedule(self)

    def run_pending(self) -> None:
        """The model's turn (broker.scheduler): the output written."""
        self.pump()

    def pump(self) -> None:
        """Write the connection's output as one buffer, then carry out its effects."""
        self._flush_scheduled = False
        conn = self.conn
        if conn is None:
            return
        out = conn.data_to_send()
        if out and not self.closing():
            self.write(out[0] if len(out) == 1 else b"".join(out))
        for effect in conn.take_effects():
            if type(effect) is SetTimer:
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
                if effect.delay > 0 and not self.closing():
                    self._timer = self._loop.call_later(effect.delay, self._fire)
            elif effect is Effect.CLOSE:
                self.close()
            elif self.closing():
                continue
            elif effect is Effect.PAUSE_READING:
                self.set_reading(True)
            elif effect is Effect.RESUME_READING:
                self.set_reading(False)

    def _fire(self) -> None:
        self._timer = None
        if self.conn is not None:
            self.conn.timer_fired()
            self.pump()


class MQTTProtocol(ConnectionDriver, asyncio.Protocol):
    """MQTT over a TCP (or TLS) socket."""

    def __init__(self, sessions: MQTTSessions, forwarded: ProxyHeader | None = None) -> None:
        super().__init__()
        self.sessions = sessions
        self.forwarded = forwarded
        self.transport: asyncio.Transport | None = None
        self._lingering = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)  # type: ignore[attr-defined]
        peer = transport.get_extra_info("peername")
        local = transport.get_extra_info("sockname")
        if self.forwarded is not None and self.forwarded.source:  # the client, and where it connected
            peer = self.forwarded.source
            local = self.forwarded.destination or local
        conn = self.sessions.new_connection(peer if isinstance(peer, tuple) else None,
                                            local if isinstance(local, tuple) else None,
                                            transport.get_extra_info("sslcontext") is not None)
        conn.peer_certificate = peer_certificate(transport.get_extra_info("ssl_object"))
        self.attach(conn)

    def data_received(self, data: bytes) -> None:
        self.received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended()
        if self.conn is not None:
            self.sessions.forget(self.conn)

    def pause_writing(self) -> None:
        if self.conn is not None:
            self.conn.set_writable(False)

    def resume_writing(self) -> None:
        if self.conn is not None:
            self.conn.set_writable(True)

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def close(self) -> None:
        """The server ends the connection. A client usually still has packets on the wire (PUBRELs,
        publishes): closing at once would answer them with a reset, which can reach the client before
        the DISCONNECT that says why. So the write side is shut once the output is written, and what
        comes meanwhile is dropped (the connection is closed) until the client closes too, or for
        LINGER_SECONDS, as AMQP's close-ok is (amqp/closing.py). TLS cannot half-close: closed at once."""
        transport = self.transport
        if transport is None or transport.is_closing() or self._lingering:
            return
        if not transport.can_write_eof():
            transport.close()
            return
        self._lingering = True
        transport.write_eof()
        transport.resume_reading()  # paused by backpressure: the leftovers must still drain
        self._loop.call_later(LINGER_SECONDS, transport.close)

    def closing(self) -> bool:
        return self.transport is None or self._lingering or self.transport.is_closing()

    def set_reading(self, paused: bool) -> None:
        assert self.transport is not None
        if paused:
            self.transport.pause_reading()
        else:
            self.transport.resume_reading()
