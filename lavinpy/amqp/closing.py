"""The end of a connection after connection.close-ok (AMQP 0-9-1 section 2.2.4).

The peer that receives close-ok closes the socket. A client usually still has publishes on the
wire behind its connection.close: closing at once would make the kernel answer them with a reset,
so the client gets EPIPE/ECONNRESET instead of its close-ok. As RabbitMQ does, the broker keeps
reading (and discarding) until the client closes, or until CLOSE_OK_TIMEOUT.
"""

from __future__ import annotations

from typing import Protocol

from pamqp import commands

from ..wire import writer
from .connection_states import CLOSED
from .effects import CancelTimer, ConnectionEffect, Effect, SetTimer, TimerKind

CLOSE_OK_TIMEOUT = 30.0  # seconds a client has to close its socket after close-ok (RabbitMQ's too)


class ClosingConnection(Protocol):
    """What answering connection.close needs of the connection."""

    def send(self, data: bytes) -> None: ...
    def flush_output(self) -> None: ...
    def enter_state(self, state: int) -> None: ...
    def teardown(self) -> None: ...
    def effect(self, effect: ConnectionEffect) -> None: ...


def send_close_ok(conn: ClosingConnection) -> None:
    """Answer the client's connection.close; from now on its input is discarded unread."""
    conn.send(writer.method_frame(0, commands.Connection.CloseOk()))
    conn.flush_output()
    conn.enter_state(CLOSED)
    conn.teardown()  # channels and exclusive queues go now, not when the client gets round to closing
    conn.effect(Effect.RESUME_READING)  # paused by a resource alarm: the leftovers must still drain
    conn.effect(CancelTimer(TimerKind.HANDSHAKE))
    conn.effect(CancelTimer(TimerKind.HEARTBEAT))
    conn.effect(SetTimer(TimerKind.LINGER, CLOSE_OK_TIMEOUT))
