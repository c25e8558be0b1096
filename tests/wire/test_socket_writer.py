"""_csocket.SocketWriter: the writer thread sends everything queued, in order, over a real socket pair;
finish() sends the rest before its side closes; abort() and a vanished peer stop it."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from lavinpy.wire import accel
from tests.helpers import wait_until

pytestmark = pytest.mark.skipif(accel.csocket is None, reason="the pure-Python path is selected")


def read_all(sock: socket.socket, into: bytearray) -> None:
    while True:
        chunk = sock.recv(1 << 16)
        if not chunk:
            return
        into += chunk


def test_everything_queued_arrives_in_order_then_eof_after_finish() -> None:
    ours, peer = socket.socketpair()
    ours.setblocking(False)  # as the event loop's sockets are: the thread waits for POLLOUT itself
    received = bytearray()
    reader = threading.Thread(target=read_all, args=(peer, received))
    writer = accel.csocket.SocketWriter(ours.fileno())
    pieces = [os.urandom(n) for n in (1, 7, 4096, 300_000, 13, 2_000_000, 5)] * 3
    for piece in pieces:
        assert writer.write(piece) >= 0  # 0: sent at once (small, the thread idle)
    reader.start()  # the peer starts reading late: the thread had to wait for a full socket
    writer.finish()
    assert writer.write(b"after finish") == -1  # refused: nothing may follow the close
    ours.close()  # the event loop closes its descriptor at once; the thread still holds its own
    reader.join(10)
    assert not reader.is_alive()
    assert bytes(received) == b"".join(pieces)
    peer.close()


def test_a_small_write_to_an_idle_writer_is_sent_at_once_and_the_rest_keeps_its_order() -> None:
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    writer = accel.csocket.SocketWriter(ours.fileno())
    assert writer.write(b"ping") == 0  # sent by the caller: nothing queued, the thread not woken
    peer.settimeout(5)
    assert peer.recv(16) == b"ping"
    big = os.urandom(4_000_000)  # more than the socket takes: the thread sends it, waiting for room
    assert writer.write(big) > 0
    assert writer.write(b"tail") > 0  # the thread is busy: queued behind the big one, not sent ahead
    received = bytearray()
    reader = threading.Thread(target=read_all, args=(peer, received))
    reader.start()
    writer.finish()
    ours.close()
    reader.join(10)
    assert bytes(received) == big + b"tail"
    peer.close()


def test_abort_drops_the_rest_and_the_peer_sees_the_end() -> None:
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    writer = accel.csocket.SocketWriter(ours.fileno())
    writer.write(b"x" * 8_000_000)  # far more than the peer's buffers hold: the thread waits
    time.sleep(0.1)
    assert writer.buffered() > 0
    writer.abort()
    received = bytearray()
    read_all(peer, received)  # returns: the socket was shut down
    assert 0 < len(received) < 8_000_000
    wait_until(lambda: writer.write(b"more") == -1, interval=0.01, what="the writer to refuse more")
    ours.close()
    peer.close()


def test_a_vanished_peer_is_reported() -> None:
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    writer = accel.csocket.SocketWriter(ours.fileno())
    peer.close()
    writer.write(b"hello")
    # the send failed: the connection must be dropped
    wait_until(lambda: writer.buffered() == -1, interval=0.01, what="the send to fail")
    assert writer.write(b"again") == -1
    ours.close()


def rss_file_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssFile:"))


def test_write_mapped_sends_a_file_mapping_slice_and_drops_its_pages(tmp_path) -> None:
    import mmap

    size = 8 * 1024 * 1024
    data = os.urandom(size)
    path = tmp_path / "segment"
    path.write_bytes(data)
    with open(path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), size)
    view = memoryview(mm)
    assert bytes(view[:16]) == data[:16]
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    received = bytearray()
    reader = threading.Thread(target=read_all, args=(peer, received))
    reader.start()
    writer = accel.csocket.SocketWriter(ours.fileno())
    before = rss_file_kib()
    mm.madvise(mmap.MADV_WILLNEED)
    bytes(view[100:size - 100])  # every page of the slice mapped in (as the copy into the writer does)
    touched = rss_file_kib()
    writer.write_mapped(view[100:size - 100])  # an unaligned slice: only its whole pages go
    after = rss_file_kib()
    writer.finish()
    ours.close()
    reader.join(10)
    assert bytes(received) == data[100:size - 100]
    assert touched - before > 4 * 1024, "the test's reads did not map the file's pages in"
    assert touched - after > 4 * 1024, f"RssFile {before} -> {touched} -> {after} KiB: the pages stayed mapped"
    assert bytes(view[:4096]) == data[:4096] and bytes(view[size - 4096:]) == data[size - 4096:]  # mapped again
    view.release()
    mm.close()
    peer.close()
