"""Heartbeats for the blocking client, whose one thread may be busy elsewhere for minutes (a Spark
task in the JVM's hands, a driver between micro-batches).

A daemon thread drives the sans-IO connection's own heartbeat rule (``ClientConnection.tick``, every
half heartbeat): it sends the heartbeat ``tick`` queues when nothing else went out, and when ``tick``
finds the broker silent for two heartbeats it shuts the socket down, so the owner's next read or write
raises ConnectionLost with the reason (``verdict``). Bytes waiting unread in the socket count as the
broker speaking (the owner reads them when it comes back).
"""

from __future__ import annotations

import select
import socket
import threading
import time
import weakref
from typing import Protocol

from lavinpy.wire.client_connection import ClientConnection


class Beating(Protocol):
    """What the thread needs of its connection."""

    sock: socket.socket | None
    client: ClientConnection | None
    io_lock: threading.RLock  # held while the owner writes: a heartbeat never splits its frame
    verdict: str


class Heartbeats:
    """The heartbeat thread of one connection; ``stop`` ends it (it also ends with the connection)."""

    def __init__(self, conn: Beating, interval: float) -> None:
        self.interval = interval
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
        """One tick: False when the connection is gone (or was just ended)."""
        sock, client = conn.sock, conn.client
        if sock is None or client is None:
            return False
        try:
            if select.select([sock], [], [], 0)[0]:
                client.note_peer_alive()  # bytes wait unread: the broker spoke
            if not conn.io_lock.acquire(timeout=self.interval):
                return True  # the owner is writing: the next tick
            try:
                if client.tick():
                    return self._end(conn, sock, client.error or "missed heartbeats from the broker")
                out = client.data_to_send()
                if out and not _send_all(sock, out, self.interval):  # a frame half sent: nothing may follow
                    return self._end(conn, sock, f"the broker read nothing for {self.interval:g} s (a heartbeat "
                                                 "left unsent)")
            finally:
                conn.io_lock.release()
        except (OSError, ValueError):  # closed meanwhile: the owner finds out by itself
            return False
        return True

    @staticmethod
    def _end(conn: Beating, sock: socket.socket, verdict: str) -> bool:
        conn.verdict = verdict
        sock.shutdown(socket.SHUT_RDWR)
        return False


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
