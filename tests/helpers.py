"""Small helpers shared by the test directories: free ports, polling until a condition holds, an opened
vhost store. Imported as ``tests.helpers`` (pyproject's pytest settings put the repository root on the
path)."""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from lavinpy.store.vhost_store import VhostStore

T = TypeVar("T")

# Linux's default ephemeral range (net.ipv4.ip_local_port_range) is 32768-60999.
_BELOW_EPHEMERAL = (20000, 32768)
# Ports below the ephemeral range handed out by this process: a test binds them later (a cluster node
# its AMQP, HTTP and clustering ports), so a second pick must not land on one (it once gave a node the
# same port for AMQP and clustering, and the node could never lead).
_handed_out: set[int] = set()


def free_port(below_ephemeral: bool = False) -> int:
    """A loopback port nothing listens on now.

    below_ephemeral: pick it below the kernel's ephemeral range, for a process restarted on the same
    port many times (a port the kernel may hand out as some client's source port meanwhile would keep
    it from binding)."""
    if not below_ephemeral:
        return free_ports(1)[0]
    while True:
        port = random.randrange(*_BELOW_EPHEMERAL)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            _handed_out.add(port)
            return port


def free_ports(count: int) -> list[int]:
    """Distinct free loopback ports: bound all at once, so the kernel cannot hand the same one out twice
    (one at a time, a broker once got the same port for HTTP and Prometheus and could not start)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def poll_until(check: Callable[[], T], timeout: float, interval: float = 0.05,
               pause: Callable[[float], Any] = time.sleep) -> T:
    """Call ``check`` until it returns a true value or ``timeout`` seconds have passed; its last value.
    ``pause(interval)`` runs between the calls (e.g. a client connection processing its events)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        pause(interval)


def wait_until(check: Callable[[], T], timeout: float = 5.0, interval: float = 0.05,
               what: str = "condition", pause: Callable[[float], Any] = time.sleep) -> T:
    """``check``'s first true value; AssertionError naming ``what`` after ``timeout`` seconds."""
    value = poll_until(check, timeout, interval, pause)
    if not value:
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
    return value


def make_store(path: Path, **settings: Any) -> VhostStore:
    """A VhostStore on ``path``, opened; ``settings`` go to its constructor (segment_size, fsync, ...)."""
    store = VhostStore(path, **settings)
    store.open()
    return store
