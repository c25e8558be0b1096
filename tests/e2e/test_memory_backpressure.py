"""Memory under clients that never read, send partial bodies or hold large transactions.

Each test runs its own broker and reads its RssAnon (heap and other anonymous memory; the segment
files and the body spool are file-backed and not counted) before and after the load.
"""

from __future__ import annotations

import socket
import threading
import time

import pika
import pytest
from pamqp import commands, frame, header
from pamqp.body import ContentBody

from . import assert_witness_served, cpu_seconds, rss_anon, uid
from .conftest import lavinpy_only
from .rawamqp import RawAMQP

pytestmark = lavinpy_only("reads the broker process's memory")

MiB = 1024 * 1024
MAX_GROWTH = 64 * MiB


def raw_client(broker, rcvbuf: int | None = None) -> RawAMQP:
    client = RawAMQP(broker.host, broker.port)
    if rcvbuf is not None:
        client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    client.handshake()
    client.open_channel(1)
    return client


def publish_backlog(broker, queue: str, count: int, size: int) -> None:
    client = raw_client(broker)
    client.call(1, commands.Queue.Declare(queue=queue), commands.Queue.DeclareOk)
    body = b"b" * size
    for _ in range(count):
        client.publish(1, "", queue, body)
    ok = client.call(1, commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk)
    assert ok.message_count == count
    client.close()


def test_consumer_that_never_reads_a_large_backlog(fresh_broker):
    queue = uid("backlog")
    publish_backlog(fresh_broker, queue, 640, 256 * 1024)  # 160 MiB
    time.sleep(0.3)
    before = rss_anon(fresh_broker.pid)
    slow = raw_client(fresh_broker, rcvbuf=4096)
    try:
        slow.send(1, commands.Basic.Consume(queue=queue, no_ack=True, nowait=True))
        time.sleep(2.0)
        assert_witness_served(fresh_broker.url)
        growth = rss_anon(fresh_broker.pid) - before
        assert growth < MAX_GROWTH, f"RssAnon grew by {growth / MiB:.1f} MiB"
    finally:
        slow.close()
    # Nothing was lost: the messages not written before the consumer went are still there
    # (no_ack ones handed to the socket are gone, as in RabbitMQ).
    check = raw_client(fresh_broker)
    left = check.call(1, commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk)
    assert 0 < left.message_count < 640
    check.close()


def assert_unread_returns_stop_the_publisher(broker, publisher: RawAMQP, rss_before: int) -> None:
    """``publisher`` (a small receive buffer, never reading) floods mandatory publishes nobody can
    route: the broker must stop reading it once its returns back up, without growing or stalling
    anyone else."""
    method = frame.marshal(commands.Basic.Publish(exchange="", routing_key=uid("nowhere"), mandatory=True), 1)
    burst = (method + publisher.content_frames(1, b"r" * (64 * 1024))) * 16  # 1 MiB
    sent = 0
    publisher.sock.settimeout(2.0)
    try:
        while sent < 300 * MiB:
            publisher.sock.sendall(burst)  # blocks once the broker stops reading us
            sent += len(burst)
    except TimeoutError:
        pass
    assert sent < 300 * MiB, "the broker kept reading a publisher that never reads its returns"
    assert_witness_served(broker.url)
    growth = rss_anon(broker.pid) - rss_before
    assert growth < MAX_GROWTH, f"RssAnon grew by {growth / MiB:.1f} MiB after {sent / MiB:.0f} MiB sent"


def test_mandatory_publisher_that_never_reads_returns(fresh_broker):
    before = rss_anon(fresh_broker.pid)
    publisher = raw_client(fresh_broker, rcvbuf=4096)
    try:
        assert_unread_returns_stop_the_publisher(fresh_broker, publisher, before)
    finally:
        publisher.close()


def test_many_channels_with_large_incomplete_bodies(fresh_broker):
    before = rss_anon(fresh_broker.pid)
    client = RawAMQP(fresh_broker.host, fresh_broker.port)
    client.handshake()
    queue = uid("partial")
    client.open_channel(1)
    client.call(1, commands.Queue.Declare(queue=queue), commands.Queue.DeclareOk)
    channels = 100
    size = 2 * MiB
    chunk = client.frame_max - 8
    body = bytes(range(256)) * (size // 256)
    for ch in range(2, channels + 2):
        client.open_channel(ch)
        out = [frame.marshal(commands.Basic.Publish(exchange="", routing_key=queue), ch),
               frame.marshal(header.ContentHeader(0, size, commands.Basic.Properties()), ch)]
        for i in range(0, size - chunk, chunk):  # all but the last frame
            out.append(frame.marshal(ContentBody(body[i:i + chunk]), ch))
        client.send_raw(b"".join(out))
    # a round trip: everything sent so far has been read
    client.call(1, commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk)
    assert_witness_served(fresh_broker.url, 0.5)
    growth = rss_anon(fresh_broker.pid) - before
    assert growth < MAX_GROWTH, f"RssAnon grew by {growth / MiB:.1f} MiB for {channels * size / MiB:.0f} MiB pending"
    # the bodies complete intact
    last = (size - 1) // chunk * chunk
    for ch in (2, channels + 1):
        client.send(ch, ContentBody(body[last:]))
    ok = client.call(1, commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk)
    assert ok.message_count == 2
    got = client.get_message(1, queue)
    assert got is not None and got[2] == body
    client.close()


def test_uncommitted_transaction(fresh_broker):
    before = rss_anon(fresh_broker.pid)
    client = raw_client(fresh_broker)
    queue = uid("tx")
    client.call(1, commands.Queue.Declare(queue=queue), commands.Queue.DeclareOk)
    client.call(1, commands.Tx.Select(), commands.Tx.SelectOk)
    body = b"t" * MiB
    for i in range(160):
        client.publish(1, "", queue, body[:-4] + i.to_bytes(4, "big"))
    ok = client.call(1, commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk)
    assert ok.message_count == 0
    growth = rss_anon(fresh_broker.pid) - before
    assert growth < MAX_GROWTH, f"RssAnon grew by {growth / MiB:.1f} MiB for 160 MiB uncommitted"
    client.call(1, commands.Tx.Commit(), commands.Tx.CommitOk)
    ok = client.call(1, commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk)
    assert ok.message_count == 160
    for i in range(2):
        got = client.get_message(1, queue)
        assert got is not None and got[2] == body[:-4] + i.to_bytes(4, "big")
    client.close()


@pytest.mark.timeout(60)
def test_thirty_thousand_consumers_on_one_channel(fresh_broker):
    n = 30_000
    queue = uid("many")
    client = raw_client(fresh_broker)
    client.call(1, commands.Queue.Declare(queue=queue), commands.Queue.DeclareOk)
    consumes = b"".join(frame.marshal(commands.Basic.Consume(queue=queue, consumer_tag=f"c{i}", nowait=True), 1)
                        for i in range(n))
    cancels = b"".join(frame.marshal(commands.Basic.Cancel(consumer_tag=f"c{i}", nowait=True), 1)
                       for i in range(n))
    latencies: list[float] = []  # the witness's waits, in the broker's CPU seconds spent meanwhile
    stop = threading.Event()
    pid = getattr(fresh_broker, "pid", None)  # another broker under test: wall-clock time stands in

    def broker_cpu() -> float:
        return cpu_seconds(pid) if pid else time.monotonic()

    def witness() -> None:
        conn = pika.BlockingConnection(pika.URLParameters(fresh_broker.url))
        ch = conn.channel()
        while not stop.is_set():
            started = broker_cpu()
            ch.queue_declare(queue, passive=True)
            latencies.append(broker_cpu() - started)
            time.sleep(0.01)
        conn.close()

    thread = threading.Thread(target=witness)
    thread.start()
    try:
        time.sleep(0.2)
        started, cpu_started = time.monotonic(), broker_cpu()
        client.send_raw(consumes)
        ok = client.call(1, commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk)
        add_time, add_cpu = time.monotonic() - started, broker_cpu() - cpu_started
        assert ok.consumer_count == n
        started, cpu_started = time.monotonic(), broker_cpu()
        client.send_raw(cancels)
        ok = client.call(1, commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk)
        remove_time, remove_cpu = time.monotonic() - started, broker_cpu() - cpu_started
        assert ok.consumer_count == 0
    finally:
        stop.set()
        thread.join(10)
    print(f"add {add_time:.2f} s ({add_cpu:.2f} s CPU), remove {remove_time:.2f} s ({remove_cpu:.2f} s CPU), "
          f"witness's longest wait {max(latencies):.2f} s of broker CPU")
    # Linear work: a few seconds of the broker's CPU at most (a quadratic add or cancel takes minutes), counted
    # in CPU time so that a busy machine does not fail it. The other client is served between the pieces of
    # the work: while it waits the broker spends little CPU, or at least a small part of the whole (not one
    # stall for all of it). Counted in the broker's CPU too: wall-clock waits grow with the machine's load.
    assert add_cpu < 6.0 and remove_cpu < 6.0
    floor = 0.5 if pid else 2.0
    assert latencies and max(latencies) < max(floor, (add_cpu + remove_cpu) / 3)
    client.close()


def test_max_consumers_per_channel(fresh_broker, tmp_path):
    config = tmp_path / "lavinpy.yaml"
    config.write_text("max_consumers_per_channel: 2\n")
    fresh_broker.stop()
    fresh_broker.extra_args = ["--config", str(config)]
    fresh_broker.start()
    client = raw_client(fresh_broker)
    client.open_channel(2)
    queue = uid("limited")
    client.call(1, commands.Queue.Declare(queue=queue), commands.Queue.DeclareOk)
    for tag in ("a", "b"):
        client.call(1, commands.Basic.Consume(queue=queue, consumer_tag=tag), commands.Basic.ConsumeOk)
    client.send(1, commands.Basic.Consume(queue=queue, consumer_tag="c"))
    close = client.expect_channel_close(1)
    assert close.reply_code == 530
    assert close.reply_text == "NOT_ALLOWED - reached maximum (2) of consumers per channel"
    client.send(1, commands.Channel.CloseOk())
    # the other channel is not affected, and gets its own two
    ok = client.call(2, commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk)
    assert ok.consumer_count == 0
    client.call(2, commands.Basic.Consume(queue=queue, consumer_tag="d"), commands.Basic.ConsumeOk)
    client.close()
