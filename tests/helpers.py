"""Small helpers shared by the test directories: free ports, polling until a condition holds, an opened
vhost store. Imported as ``tests.helpers`` (pyproject's pytest settings put the repository root on the
path)."""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import os
import random
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from lavinpy.store.vhost_store import VhostStore

T = TypeVar("T")

# LAVINPY_LONG=1: the long sizes of the tests that repeat a fault or a random step (kills, crash rounds,
# fuzzed frames, model steps). CI runs the short size of each, which exercises every behaviour once or more;
# the long size repeats it to find rarer interleavings. (The Jepsen suite has its own LAVINPY_JEPSEN=long.)
LONG = os.environ.get("LAVINPY_LONG") == "1"

# Linux's default ephemeral range (net.ipv4.ip_local_port_range) is 32768-60999. Every port a test hands
# to a listener comes from below it: a port picked inside it could be given meanwhile, between the pick
# and the broker's bind, as some client's source port or to a listener on port 0 (a broker once could
# not start: "cannot listen for Prometheus ...: Address already in use").
_BELOW_EPHEMERAL = (20000, 32768)
# The next port this process tries in its share of the range: ports go out in turn, so one is handed out
# again only after the whole share has gone round (a second pick must not land on a port a test binds
# later: it once gave a cluster node the same port for AMQP and clustering, and the node could never lead).
_cursor: int | None = None


def worker_share(ports: tuple[int, int]) -> tuple[int, int]:
    """Under pytest-xdist (-n N), worker gwK's own slice of a port range: ports a worker remembers as
    handed out are unknown to the others."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2:
        return ports
    share = (ports[1] - ports[0]) // count
    start = ports[0] + int(worker[2:]) * share
    return start, start + share


def _bindable(port: int) -> bool:
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        with socket.socket(family) as s:
            try:
                s.bind((host, port))
            except OSError as e:
                # a machine without IPv6 on loopback has nothing to collide with there
                if family == socket.AF_INET6 and e.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                    continue
                return False
    return True


def free_ports(count: int) -> list[int]:
    """Distinct loopback ports nothing listens on now, below the ephemeral range and in this worker's
    share of it, none handed out before by this process until its share has gone round."""
    global _cursor
    low, high = worker_share(_BELOW_EPHEMERAL)
    if _cursor is None:
        _cursor = random.randrange(low, high)
    ports: list[int] = []
    for _ in range(high - low):
        port, _cursor = _cursor, low + (_cursor + 1 - low) % (high - low)
        if _bindable(port):
            ports.append(port)
            if len(ports) == count:
                return ports
    raise RuntimeError(f"no {count} free loopback ports in {low}-{high}")


def free_port(below_ephemeral: bool = True) -> int:
    """A loopback port nothing listens on now (always below the ephemeral range: ``below_ephemeral``
    is kept for callers that name it)."""
    return free_ports(1)[0]


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


def http_request(base_url: str, method: str, path: str, body: Any = None, *, user: str = "guest",
                 password: str = "guest", raw: bytes | None = None, headers: dict[str, str] | None = None,
                 timeout: float = 30) -> tuple[int, Any, dict[str, str]]:
    """One request to a management API at ``base_url``: (status, decoded JSON or None, headers).

    ``path`` is sent as given (already percent-encoded, e.g. /api/queues/%2F/q); ``body`` is sent
    as JSON, ``raw`` as bytes.
    """
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(base_url + path, data=data, method=method)
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, payload, reply_headers = response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as e:
        status, payload, reply_headers = e.code, e.read(), dict(e.headers)
    return status, (json.loads(payload) if payload.strip() else None), reply_headers


def http_json(url: str, method: str, body: Any = None, *, authorization: str, timeout: float = 10) -> Any:
    """One JSON request with an Authorization header: the decoded reply (None when empty); an error
    status raises urllib's HTTPError, for the tests that expect a refusal to raise."""
    request = urllib.request.Request(url, method=method, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": authorization, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        data = response.read()
    return json.loads(data) if data else None


def connect_from(source: str, port: int) -> socket.socket:
    """A TCP connection to a loopback port from the local address ``source`` (e.g. 127.0.0.2)."""
    sock = socket.socket()
    sock.bind((source, 0))
    sock.settimeout(5)
    sock.connect(("127.0.0.1", port))
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything the peer sends until it closes."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


@contextlib.contextmanager
def serving(address: str, handle: Callable[[socket.socket], None]) -> Iterator[int]:
    """A TCP service on a free port of ``address`` for the block: a thread accepts each connection and
    hands it to ``handle``; yields the port, and stops the thread and the listener at the end."""
    listener = socket.create_server((address, 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            handle(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        listener.close()
