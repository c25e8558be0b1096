"""_csocket.SocketReader: the reader thread hands over everything received, in order, over real sockets;
its wake-up fd is readable exactly while there is something to take; it stops receiving when paused or
when its backlog is full (the peer's sends then block); it reports EOF and resets after the data; stop()
leaves no descriptor behind."""

from __future__ import annotations

import contextlib
import errno
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from lavinpy.wire import accel

pytestmark = pytest.mark.skipif(accel.csocket is None or not hasattr(accel.csocket, "SocketReader"),
                                reason="no compiled reader thread (pure Python or not Linux)")

MiB = 1024 * 1024


def readable(fd: int, timeout: float = 0.0) -> bool:
    return bool(select.select([fd], [], [], timeout)[0])


def take_all(reader, until: int, timeout: float = 10.0) -> tuple[bytes, int]:
    """Take as the event loop does (waiting on wake_fd) until ``until`` bytes or the end arrived."""
    got = bytearray()
    deadline = time.monotonic() + timeout
    while len(got) < until:
        assert time.monotonic() < deadline, f"only {len(got)} of {until} bytes"
        if not readable(reader.wake_fd, 0.1):
            continue
        data, end = reader.take(256 * 1024)
        got += data
        if end:
            return bytes(got), end
    return bytes(got), 0


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        peer = socket.create_connection(server.getsockname())
        ours, _ = server.accept()
    return ours, peer


@contextlib.contextmanager
def reading(tcp: bool = False, cap: int = 4 * MiB, hold_us: int | None = None,
            rcvbuf: int | None = None) -> Iterator[tuple[Any, socket.socket]]:
    """A reader thread on our end of a connected pair (non-blocking, as the event loop's sockets are)
    and the peer's socket; both closed and the thread stopped afterwards."""
    ours, peer = tcp_pair() if tcp else socket.socketpair()
    ours.setblocking(False)
    if rcvbuf is not None:
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, rcvbuf)
    args = (ours.fileno(), cap) if hold_us is None else (ours.fileno(), cap, hold_us)
    reader = accel.csocket.SocketReader(*args)
    try:
        yield reader, peer
    finally:
        reader.stop()
        ours.close()
        peer.close()


def test_everything_arrives_in_order_and_the_wake_fd_follows_the_backlog() -> None:
    with reading() as (reader, peer):
        assert not readable(reader.wake_fd, 0.1)
        pieces = [os.urandom(n) for n in (1, 7, 4096, 300_000, 13, 2_000_000, 5)]
        sender = threading.Thread(target=lambda: [peer.sendall(p) for p in pieces])
        sender.start()
        got, end = take_all(reader, sum(map(len, pieces)))
        sender.join()
        assert got == b"".join(pieces) and end == 0
        assert not readable(reader.wake_fd, 0.1)  # emptied: no wake-up until the next byte
        assert reader.take(100) == (b"", 0)
        peer.sendall(b"next")
        assert readable(reader.wake_fd, 5)
        assert reader.take(2) == (b"ne", 0)
        assert readable(reader.wake_fd)  # still something to take
        assert reader.take(100) == (b"xt", 0)


def test_a_full_backlog_stops_receiving_until_taken() -> None:
    cap = MiB
    with reading(tcp=True, cap=cap, rcvbuf=64 * 1024) as (reader, peer):
        payload = os.urandom(32 * MiB)
        peer.settimeout(1.0)
        sent = 0
        try:
            while sent < len(payload):
                sent += peer.send(payload[sent:sent + 256 * 1024])
        except TimeoutError:
            pass
        assert sent < 8 * MiB, "the reader kept receiving past its cap"
        assert reader.buffered <= cap
        peer.settimeout(None)
        sender = threading.Thread(target=peer.sendall, args=(payload[sent:],))
        sender.start()
        got, _end = take_all(reader, len(payload), timeout=30)
        sender.join()
        assert got == payload


def test_paused_it_stops_receiving_and_resumed_it_goes_on() -> None:
    with reading(tcp=True, rcvbuf=64 * 1024) as (reader, peer):
        reader.set_paused(True)
        payload = os.urandom(16 * MiB)
        sender = threading.Thread(target=peer.sendall, args=(payload,))
        sender.start()
        time.sleep(0.5)
        assert reader.buffered <= 128 * 1024  # at most the one receive under way when it paused
        assert sender.is_alive()  # TCP stopped the peer
        reader.set_paused(False)
        got, _end = take_all(reader, len(payload), timeout=30)
        sender.join()
        assert got == payload


def test_eof_and_reset_are_reported_after_the_data() -> None:
    with reading() as (reader, peer):
        peer.sendall(b"last words")
        peer.close()
        assert take_all(reader, 1 << 20) == (b"last words", 1)
    with reading(tcp=True) as (reader, peer):
        peer.sendall(b"cut")
        time.sleep(0.2)
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        peer.close()  # RST
        assert take_all(reader, 1 << 20) == (b"cut", -errno.ECONNRESET)


def _descriptors_and_threads() -> set[tuple[str, str]]:
    """This process's open descriptors (each with what it refers to: a socket's inode tells one socket
    from another) and threads."""
    found = {("thread", tid) for tid in os.listdir("/proc/self/task")}
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile (the listing's own descriptor among them)
            found.add((fd, os.readlink(f"/proc/self/fd/{fd}")))
    return found


def test_stop_leaves_no_descriptors_or_threads() -> None:
    # What the readers made must be gone; what other tests' threads close or end meanwhile (the same
    # worker process) is not this test's business, so only new entries count.
    before = _descriptors_and_threads()
    for _ in range(50):
        with reading(cap=MiB) as (reader, peer):
            peer.sendall(b"x" * 1000)
        del reader  # its wake-up fd goes with the object
    deadline = time.monotonic() + 5
    while (left := _descriptors_and_threads() - before) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not left


# The reader's longest hold (it takes less than 1 s): "at once" and "held" stay apart by more than a
# time slice of a loaded machine's scheduler, which a 0.4 s window did not (one preempted sleep ended it).
HOLD_US = 900_000
AT_ONCE = 0.5  # s: handed over without a hold, well inside the window


def test_streaming_input_is_held_for_one_wake_up_and_a_lone_request_is_not() -> None:
    with reading(cap=MiB, hold_us=HOLD_US) as (reader, peer):
        peer.sendall(b"request")  # after a quiet time: handed over at once
        assert readable(reader.wake_fd, AT_ONCE)
        assert reader.take(100) == (b"request", 0)
        peer.sendall(b"stream 1,")  # follows the request within the window: waits for more
        time.sleep(0.05)
        peer.sendall(b"stream 2")
        assert not readable(reader.wake_fd, 0.1)
        assert readable(reader.wake_fd, 5)  # at the end of the window
        assert reader.take(100) == (b"stream 1,stream 2", 0)  # one wake-up for both


def test_a_piece_after_an_answer_is_not_held() -> None:
    with reading(cap=MiB, hold_us=HOLD_US) as (reader, peer):
        peer.sendall(b"request 1")
        assert readable(reader.wake_fd, AT_ONCE)
        assert reader.take(100) == (b"request 1", 0)
        reader.answered()  # the loop replied: the client's next piece is another request, not a stream
        peer.sendall(b"request 2")
        assert readable(reader.wake_fd, AT_ONCE)
        assert reader.take(100) == (b"request 2", 0)


def test_a_stream_that_goes_on_is_paced_and_an_answer_ends_the_pacing() -> None:
    with reading(cap=MiB, hold_us=HOLD_US) as (reader, peer):
        peer.sendall(b"a")
        assert readable(reader.wake_fd, AT_ONCE)
        assert reader.take(100) == (b"a", 0)
        peer.sendall(b"b")  # a stream: held to the end of the window
        assert readable(reader.wake_fd, 5)
        assert reader.take(100) == (b"b", 0)
        # the thread now sleeps a period: what the client writes meanwhile comes in one wake-up
        peer.sendall(b"c")
        time.sleep(0.05)
        peer.sendall(b"d")
        assert not readable(reader.wake_fd, 0.1)
        assert readable(reader.wake_fd, 5)
        assert reader.take(100) == (b"cd", 0)
        # the thread sleeps the next period; an answer may make the client wait: the sleep ends
        reader.answered()
        peer.sendall(b"e")
        assert readable(reader.wake_fd, AT_ONCE)
        assert reader.take(100) == (b"e", 0)
