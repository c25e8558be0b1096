"""Heartbeats for the blocking client, whose one thread may be busy elsewhere for minutes (a Spark
task in the JVM's hands, a driver between micro-batches).

A daemon thread wakes every half heartbeat: it sends a heartbeat frame when the connection sent
nothing since the last wake, and it ends the connection when the broker has been silent for two
heartbeats. Bytes waiting unread in the socket count as the broker speaking (the owner reads them
when it comes back). Ending means shutting the socket down: the owner's next read or write raises
ConnectionLost with the reason (``verdict``).
"""

from __future__ import annotations

import select
import socket
import threading
import time
import weakref
from typing import Protocol

from lavinpy.wire.constants import FRAME_END, FRAME_HEARTBEAT

HEARTBEAT_FRAME = bytes((FRAME_HEARTBEAT, 0, 0, 0, 0, 0, 0, FRAME_END))
SILENT_BEATS = 2  # the broker silent this many heartbeats is dead (AMQP 0-9-1, 4.2.7)


class Beating(Protocol):
    """What the thread needs of its connection."""

    sock: socket.socket | None
    io_lock: threading.RLock
    last_sent: float
    last_heard: float
    verdict: str


class Heartbeats:
    """The heartbeat thread of one connection; ``stop`` ends it (it also ends with the connection)."""

    def __init__(self, conn: Beating, heartbeat: int) -> None:
        self.interval = heartbeat / 2
        self.heartbeat = heartbeat
        self._conn = weakref.ref(conn)  # a connection dropped unclosed ends its thread
        self._stopped = threading.Event()
        threading.Thread(target=self._run, name="amqp-heartbeat", daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        while not self._stopped.wait(self.interval):
            conn = self._conn()
            if conn is None or not self.beat(conn):
                return
            del conn

    def beat(self, conn: Beating) -> bool:
        """One wake: False when the connection is gone (or was just ended for silence)."""
        sock, now = conn.sock, time.monotonic()
        if sock is None:
            return False
        try:
            if now - conn.last_heard >= self.interval and select.select([sock], [], [], 0)[0]:
                conn.last_heard = now  # bytes wait unread: the broker spoke
            silent = now - conn.last_heard
            if silent >= SILENT_BEATS * self.heartbeat:
                conn.verdict = f"missed heartbeats from the broker (silent for {silent:.0f} s)"
                sock.shutdown(socket.SHUT_RDWR)
                return False
            if now - conn.last_sent >= self.interval and conn.io_lock.acquire(blocking=False):
                try:  # not while the owner sends: its frame would be split
                    if not _send_all(sock, HEARTBEAT_FRAME, self.interval):
                        conn.verdict = f"the broker read nothing for {self.interval:g} s (a heartbeat left unsent)"
                        sock.shutdown(socket.SHUT_RDWR)  # a frame half sent: nothing may follow it
                        return False
                    conn.last_sent = now
                finally:
                    conn.io_lock.release()
        except (OSError, ValueError):  # closed meanwhile: the owner finds out by itself
            return False
        return True


def _send_all(sock: socket.socket, data: bytes, timeout: float) -> bool:
    """All of ``data`` on a non-blocking socket within ``timeout`` seconds; False when it did not fit."""
    view = memoryview(data)
    deadline = time.monotonic() + timeout
    while view:
        try:
            view = view[sock.send(view):]
        except (BlockingIOError, InterruptedError):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            select.select([], [sock], [], remaining)
    return True
