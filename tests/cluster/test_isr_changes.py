"""The ISR's rules against a real broker and real follower processes: a follower leaves the confirm
barrier only after etcd's ISR no longer names it (F1), etcd names a joining follower only once it
holds everything confirmed (F2), and a silent peer is noticed on both ends while nothing is published
(F4: heartbeats and read timeouts)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import struct
import threading
import time
from pathlib import Path

import pika
import pytest

from lavinpy.cluster.replication_client import STREAM_READ_TIMEOUT, ReplicationClient

from .replication_harness import SECRET, Leader, MemoryIsr, start_follower, stop_process

pytestmark = pytest.mark.timeout(120)


class GatedIsr(MemoryIsr):
    """etcd's ISR where shrinking writes hang until the test opens the gate (etcd cut off)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate: asyncio.Event | None = None
        self.held_since: float | None = None
        self.opened_at: float | None = None

    async def write_isr(self, members: list[str], epoch: int = 0) -> None:
        if self.gate is not None and self.writes and len(members) < len(self.members):
            self.held_since = time.monotonic()
            await self.gate.wait()
        await super().write_isr(members, epoch)


def test_a_dropped_follower_holds_confirms_until_etcd_no_longer_names_it(tmp_path: Path) -> None:
    leader = Leader(tmp_path / "leader")
    isr = leader.isr = GatedIsr()
    leader.start()
    leader.replication.ack_timeout = 1.0
    isr.gate = leader.call(lambda: _make_event())
    followers = [start_follower(tmp_path / name, leader.replication.port, name) for name in ("f1", "f2")]
    try:
        for name in ("f1", "f2"):
            leader.wait_caught_up(name)
        assert isr.members == ["leader", "f1", "f2"]
        connection = pika.BlockingConnection(pika.URLParameters(leader.url))
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("q", durable=True)

        os.kill(followers[1].pid, signal.SIGSTOP)  # f2 stops acknowledging: dropped after 1 s
        confirmed: list[float] = []

        def publish() -> None:
            channel.basic_publish("", "q", b"m", pika.BasicProperties(delivery_mode=2))
            confirmed.append(time.monotonic())
        publisher = threading.Thread(target=publish, daemon=True)
        publisher.start()
        leader.wait(lambda: isr.held_since is not None, 10, "the ISR shrink to be attempted")
        other = pika.BlockingConnection(pika.URLParameters(leader.url))  # more traffic, acknowledged by f1
        other.channel().basic_publish("", "q", b"n", pika.BasicProperties(delivery_mode=2))
        time.sleep(3)  # etcd does not answer meanwhile
        isr.opened_at = time.monotonic()
        leader.loop.call_soon_threadsafe(isr.gate.set)
        publisher.join(10)
        assert confirmed and confirmed[0] >= isr.opened_at, (
            "a confirm went out while etcd still named the dropped follower as in sync")
        assert isr.members == ["leader", "f1"]
        other.close()
        connection.close()
    finally:
        for process in followers:
            stop_process(process)
        leader.stop()


def test_etcd_names_a_joining_follower_only_once_it_holds_everything_confirmed(tmp_path: Path) -> None:
    leader = Leader(tmp_path / "leader").start()
    server = leader.replication
    confirmed_up_to = [0]
    violations: list[tuple[int, int]] = []

    # Record the stream position every confirm covered, and check every ISR write against it.
    original = server.on_replicated

    def on_replicated(callback):
        target = server._log_end

        def released() -> None:
            confirmed_up_to[0] = max(confirmed_up_to[0], target)
            callback()
        original(released)
    server.on_replicated = on_replicated
    write = leader.isr.write_isr

    async def checked_write(members: list[str], epoch: int = 0) -> None:
        for follower in server._followers.values():
            if follower.id in members and follower.acked < confirmed_up_to[0]:
                violations.append((follower.acked, confirmed_up_to[0]))
        await write(members, epoch)
    leader.isr.write_isr = checked_write

    stop = threading.Event()

    def publish() -> None:  # confirms keep advancing while the follower syncs and joins
        connection = pika.BlockingConnection(pika.URLParameters(leader.url))
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("load", durable=True)
        while not stop.is_set():
            channel.basic_publish("", "load", b"x" * 2000, pika.BasicProperties(delivery_mode=2))
        connection.close()
    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    followers = []
    try:
        time.sleep(1)
        for round_ in range(3):
            name = f"f{round_}"
            followers.append(start_follower(tmp_path / name, server.port, name))
            leader.wait(lambda name=name: name in leader.isr.members, 30, f"{name} in the ISR")
        assert not violations, f"written into the ISR behind what was confirmed (acked, confirmed): {violations}"
    finally:
        stop.set()
        publisher.join(10)
        for process in followers:
            stop_process(process)
        leader.stop()


def test_an_idle_silent_follower_is_dropped_and_a_silent_leader_is_left(tmp_path: Path) -> None:
    leader = Leader(tmp_path / "leader").start()
    follower = start_follower(tmp_path / "follower", leader.replication.port)
    output = ""
    try:
        leader.wait_caught_up("follower")
        # Nothing is published: only the heartbeats show that the follower no longer answers.
        os.kill(follower.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        leader.wait(lambda: leader.isr.members == ["leader"], 10, "the silent follower dropped from the ISR")
        assert time.monotonic() - stopped < 6
        os.kill(follower.pid, signal.SIGCONT)
        leader.wait_caught_up("follower")

        # The leader goes silent (its event loop held): the follower gives up on the link by itself.
        leader.loop.call_soon_threadsafe(time.sleep, 8)
        time.sleep(7.5)
    finally:
        output = stop_process(follower)
        leader.stop()
    assert "timed out" in output, output[-2000:]


def test_a_streaming_follower_waits_for_the_leader_in_the_kernel(tmp_path: Path) -> None:
    """The stream's socket is blocking with SO_RCVTIMEO/SO_SNDTIMEO: a Python timeout polls before every
    recv and send (two more system calls a batch). The silent leader's timeout is the test above."""
    leader = Leader(tmp_path / "leader").start()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    assert leader.replication is not None
    client = ReplicationClient(tmp_path / "follower", SECRET, "follower", "127.0.0.1", leader.replication.port)
    run = asyncio.run_coroutine_threadsafe(client.run(), loop)
    try:
        leader.wait_caught_up("follower")
        sock = client._sock
        assert sock is not None and client.streamed
        assert sock.gettimeout() is None
        expected = struct.pack("ll", int(STREAM_READ_TIMEOUT), 0)
        for option in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
            assert sock.getsockopt(socket.SOL_SOCKET, option, len(expected)) == expected
    finally:
        asyncio.run_coroutine_threadsafe(client.close(), loop).result(10)
        run.result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        leader.stop()


def test_a_node_that_reconnects_while_its_old_connection_leaves_the_isr_joins_again(tmp_path: Path) -> None:
    # The old connection's leave waits for etcd; meanwhile the same node connects again and enters the
    # barrier. The leave must not remove the new connection's entry: the node would never rejoin.
    leader = Leader(tmp_path / "leader")
    isr = leader.isr = GatedIsr()
    leader.start()
    server = leader.replication
    isr.gate = leader.call(lambda: _make_event())
    follower = start_follower(tmp_path / "f1", server.port, "f1")
    try:
        leader.wait_caught_up("f1")
        assert isr.members == ["leader", "f1"]
        follower.kill()  # its connection closes: dropped, and the ISR shrink hangs on etcd
        follower.wait()
        leader.wait(lambda: isr.held_since is not None, 10, "the ISR shrink to be attempted")
        follower = start_follower(tmp_path / "f1", server.port, "f1")
        leader.wait(lambda: "f1" in server._followers and server._followers["f1"].writing_isr, 30,
                    "the reconnected follower to wait to be named in etcd")
        written = len(isr.writes)
        leader.loop.call_soon_threadsafe(isr.gate.set)
        leader.wait(lambda: len(isr.writes) >= written + 2, 10, "the reconnected follower back in the ISR")
        assert [members for _, members in isr.writes][written:] == [["leader"], ["leader", "f1"]]
    finally:
        stop_process(follower)
        leader.stop()


async def _make_event() -> asyncio.Event:
    return asyncio.Event()
