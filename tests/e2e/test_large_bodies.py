"""Large message bodies: many frames, bigger than a segment, back byte for byte, in bounded memory.

A body that arrives in many frames is written into its record's place in a segment as it arrives
(a body over the segment size gets a segment of its own) and delivered as slices of what holds it,
handed to the socket no faster than it drains. So the broker's resident memory grows by a small
multiple of one body at most (file-backed pages of the segment included), and its
anonymous memory (heap and buffers) by much less than one body.
"""

from __future__ import annotations

import socket
import threading
import time

import pika
import pytest
from pamqp import commands

from lavinpy.wire import writer

from . import rss_anon, uid
from .conftest import LocalBroker, lavinpy_only
from .rawamqp import RawAMQP

pytestmark = lavinpy_only("reads the broker process's memory")

MiB = 1024 * 1024


def vm_rss(pid: int) -> int:
    """Resident memory in bytes, file-backed mappings (spool, segments) included."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc status")


class PeakMemory:
    """Samples a process's VmRSS and RssAnon in a thread; the peaks over the ``with`` block."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.rss = self.anon = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.rss = max(self.rss, vm_rss(self.pid))
            self.anon = max(self.anon, rss_anon(self.pid))
            time.sleep(0.005)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.fixture
def big_broker(tmp_path) -> LocalBroker:
    broker = LocalBroker(tmp_path / "broker")
    config = tmp_path / "big.yaml"
    config.write_text(f"max_message_size: {200 * MiB}\n")
    broker.extra_args = ["--config", str(config)]
    broker.start()
    try:
        yield broker
    finally:
        if broker.running():
            broker.stop()


def pattern(size: int, seed: int) -> bytes:
    """A body whose every 4 KiB block differs (a misplaced or repeated frame shows)."""
    block = bytes((i * 7 + seed) & 0xFF for i in range(4096))
    return b"".join(i.to_bytes(4, "big") + block[4:] for i in range(size // 4096)) + block[:size % 4096]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("size", [16 * MiB, 130 * MiB], ids=["16MiB", "130MiB"])
def test_large_persistent_body_round_trips_in_bounded_memory(big_broker, size):
    body = pattern(size, size >> 20)
    queue = uid("big")
    conn = pika.BlockingConnection(pika.URLParameters(big_broker.url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(queue, durable=True)
        time.sleep(0.2)
        rss_before, anon_before = vm_rss(big_broker.pid), rss_anon(big_broker.pid)
        with PeakMemory(big_broker.pid) as peak:
            ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))  # confirmed
            method, _props, got = next(ch.consume(queue, inactivity_timeout=60))
            assert method is not None, "no delivery"
            ch.basic_ack(method.delivery_tag)
            ch.cancel()
        assert len(got) == size
        assert got == body
        assert ch.queue_declare(queue, passive=True).method.message_count == 0
        ch.queue_delete(queue)
    finally:
        conn.close()
    rss_growth, anon_growth = peak.rss - rss_before, peak.anon - anon_before
    print(f"{size / MiB:.0f} MiB body: peak VmRSS +{rss_growth / MiB:.0f} MiB, RssAnon +{anon_growth / MiB:.0f} MiB")
    assert rss_growth < 3 * size, f"VmRSS grew by {rss_growth / MiB:.0f} MiB for a {size / MiB:.0f} MiB body"
    assert anon_growth < size // 2 + 16 * MiB, f"RssAnon grew by {anon_growth / MiB:.0f} MiB"


@pytest.mark.timeout(90)
def test_consumer_that_never_reads_a_large_body(big_broker):
    """The delivery of a 64 MiB body to a client that reads nothing stops at the write buffer's
    high-water mark: the rest of the body stays where it is stored, not in the broker's heap."""
    size = 64 * MiB
    queue = uid("unread")
    publisher = pika.BlockingConnection(pika.URLParameters(big_broker.url))
    ch = publisher.channel()
    ch.confirm_delivery()
    ch.queue_declare(queue)
    body = pattern(size, 3)
    time.sleep(0.2)
    anon_before = rss_anon(big_broker.pid)
    slow = RawAMQP(big_broker.host, big_broker.port)
    slow.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.handshake()
    slow.open_channel(1)
    try:
        with PeakMemory(big_broker.pid) as peak:
            slow.send(1, commands.Basic.Consume(queue=queue, no_ack=False, nowait=True))
            ch.basic_publish("", queue, body)
            time.sleep(1.5)  # the broker has long written what the socket takes
            # others are still served
            assert ch.queue_declare(queue, passive=True).method.consumer_count == 1
        growth = peak.anon - anon_before
        print(f"RssAnon +{growth / MiB:.0f} MiB while a 64 MiB delivery waits")
        assert growth < 24 * MiB, f"RssAnon grew by {growth / MiB:.0f} MiB for an unread 64 MiB delivery"
    finally:
        slow.close()
    # the unacked message went back to the queue, whole
    got = None
    for _ in range(100):
        method, _props, got = ch.basic_get(queue, auto_ack=True)
        if method is not None:
            break
        time.sleep(0.05)
    assert got == body
    publisher.close()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("followed", [True, False], ids=["followed", "at-the-tail"])
def test_kill9_mid_body_leaves_no_message_and_recovers_clean(big_broker, followed):
    """A large body is written into its record as its frames arrive: a broker killed while a body is
    half received restarts with no trace of that message (nor an error), the confirmed messages
    around it whole, and the space taken again or stepped over."""
    queue = uid("killed-mid-body")
    conn = pika.BlockingConnection(pika.URLParameters(big_broker.url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(queue, durable=True)
    before = pattern(200 * 1024, 1)
    ch.basic_publish("", queue, before, pika.BasicProperties(delivery_mode=2))  # confirmed
    half = RawAMQP(big_broker.host, big_broker.port)
    half.handshake()
    half.open_channel(1)
    body = pattern(4 * MiB, 2)
    frames = half.content_frames(1, body, commands.Basic.Properties(delivery_mode=2))
    half.send_raw(writer_publish(queue) + frames[:len(frames) // 2])
    after = pattern(300 * 1024, 3)
    time.sleep(0.5)  # the broker took the first half into the reserved record
    if followed:
        ch.basic_publish("", queue, after, pika.BasicProperties(delivery_mode=2))  # confirmed: on disk
    big_broker.kill9()
    half.close()
    big_broker.start()
    conn = pika.BlockingConnection(pika.URLParameters(big_broker.url))
    ch = conn.channel()
    got = []
    while (message := ch.basic_get(queue, auto_ack=True))[0] is not None:
        got.append(message[2])
    assert got == ([before, after] if followed else [before])
    # the store writes on as before: a body of the same size goes through and comes back
    ch.confirm_delivery()
    ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
    assert ch.basic_get(queue, auto_ack=True)[2] == body
    conn.close()
    assert "damaged" not in big_broker.log and "Traceback" not in big_broker.log


def writer_publish(queue: str) -> bytes:
    return writer.method_frame(1, commands.Basic.Publish(exchange="", routing_key=queue))
