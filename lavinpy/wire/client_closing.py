"""The blocking client's connections closed without waiting for their close-ok (close_soon).

A socket closed with a reply unread resets the connection, and a reset can drop bytes still on their
way to the broker; so such a connection waits here until its close-ok (or the end of its stream) has
been read, and only then is its socket closed.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections import deque
from typing import Protocol


class Closing(Protocol):
    def close_ok_came(self) -> bool: ...

    def abort(self) -> None: ...


class ClosingConnections:
    """Connections closed by close_soon whose close-ok has not been read yet. Reaped whenever a
    connection opens or another is handed over, so a process that keeps opening connections (a
    reused Spark worker) holds a few at most; one that stops holds them until it exits (the broker
    has closed its end by then: only the socket is left)."""

    MAX = 16  # more than this: the oldest is closed unread
    WAIT_S = 30.0  # a close-ok this late is not waited for any longer

    def __init__(self) -> None:
        self.connections: deque[tuple[Closing, float]] = deque()
        self._lock = threading.Lock()  # a process's threads may each close connections

    def hand_over(self, conn: Closing) -> None:
        self.reap()
        with self._lock:
            self.connections.append((conn, time.monotonic()))
            while len(self.connections) > self.MAX:
                self.connections.popleft()[0].abort()

    def reap(self) -> None:
        if not self.connections:
            return
        with self._lock:
            now = time.monotonic()
            kept: deque[tuple[Closing, float]] = deque()
            for conn, since in self.connections:
                if now - since > self.WAIT_S:
                    conn.abort()
                elif not conn.close_ok_came():
                    kept.append((conn, since))
            self.connections = kept

    def settle(self, timeout: float = 1.0) -> None:
        """Wait up to timeout seconds for the close-oks still on their way, then close every socket
        (at the process's exit)."""
        deadline = time.monotonic() + timeout
        while self.connections and time.monotonic() < deadline:
            self.reap()
            if self.connections:
                time.sleep(0.005)
        with self._lock:
            while self.connections:
                self.connections.popleft()[0].abort()


closing = ClosingConnections()
atexit.register(closing.settle)
