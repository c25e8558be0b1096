"""Busy connections' socket threads (compiled path): past 1 MiB of input a plain TCP connection is read by
a thread without the GIL, past 1 MiB of output written by another. Everything a connection does must
work the same across the switch: large multi-frame messages, back-pressure (a client whose output is
backed up, a resource alarm), heartbeats, every way of ending (close, EOF, reset, mid-frame), and the
threads and descriptors of closed connections must all go. With the pure-Python path (no threads) the
same behaviour is checked, without the thread counts."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time

import pytest
from pamqp import commands, frame, header
from pamqp.body import ContentBody

from lavinpy.wire import accel

from . import assert_witness_served, rss_anon, uid
from .conftest import lavinpy_only
from .rawamqp import PeerClosed, RawAMQP
from .test_memory_backpressure import (
    MiB,
    assert_unread_returns_stop_the_publisher,
    raw_client,
)
from .test_policies_alarms import inproc  # noqa: F401 - the fixture

pytestmark = lavinpy_only("counts the broker process's threads and descriptors")

READER_THREADS = accel.csocket is not None and hasattr(accel.csocket, "SocketReader")
BODY = 100 * 1024  # a frame_max of 128 KiB: one body frame per message, several per read
PAST_SWITCH = 3 * MiB // 2  # more input than a connection reads before its reader thread starts


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def fds(pid: int) -> int:
    """Descriptors other than the store's segment files (the next segment is made ahead, mapped, once
    half of the current one is written: one more open file that belongs to no connection)."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:  # closed meanwhile
            continue
        count += "msgs." not in target
    return count


def eventually(check, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def publishes(client: RawAMQP, queue: str, nbytes: int, body_size: int = BODY, first: int = 0) -> tuple[bytes, int]:
    """Frames of publishes to ``queue`` totalling about nbytes of bodies, each body marked with its number."""
    count = max(1, nbytes // body_size)
    out = []
    for i in range(first, first + count):
        body = i.to_bytes(4, "big") * (body_size // 4)
        out.append(frame.marshal(commands.Basic.Publish(exchange="", routing_key=queue), 1))
        out.append(client.content_frames(1, body))
    return b"".join(out), count


def round_trip(client: RawAMQP) -> None:
    """Everything sent before has been read and handled."""
    client.call(1, commands.Basic.Qos(prefetch_count=0), commands.Basic.QosOk)


def message_count(client: RawAMQP, queue: str) -> int:
    return client.call(1, commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk).message_count


def busy_client(broker, queue: str, routing_key: str | None = None, **handshake) -> RawAMQP:
    """A connection that has sent enough to be read by a reader thread (compiled path): publishes to
    ``queue``, or to ``routing_key`` when given (no queue: dropped)."""
    client = RawAMQP(broker.host, broker.port)
    client.handshake(**handshake)
    client.open_channel(1)
    client.call(1, commands.Queue.Declare(queue=queue), commands.Queue.DeclareOk)
    data, _count = publishes(client, queue if routing_key is None else routing_key, PAST_SWITCH)
    client.send_raw(data)
    round_trip(client)
    return client


def baseline(broker) -> tuple[int, int]:
    """Threads and descriptors once a connection has come and gone (lazily made threads exist)."""
    queue = uid("warm")
    client = busy_client(broker, queue)
    client.call(1, commands.Queue.Delete(queue=queue), commands.Queue.DeleteOk)
    client.close()
    time.sleep(0.5)
    return threads(broker.pid), fds(broker.pid)


def test_large_multi_frame_messages_through_a_reader_thread(fresh_broker) -> None:
    before_threads, _ = baseline(fresh_broker)
    queue = uid("large")
    client = busy_client(fresh_broker, uid("warm"), frame_max=4096)  # 4 KiB frames: many per message
    if READER_THREADS:
        assert eventually(lambda: threads(fresh_broker.pid) > before_threads), "no reader thread"
    client.call(1, commands.Queue.Declare(queue=queue), commands.Queue.DeclareOk)
    client.call(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
    sizes = [3 * MiB + 7, 1, 0, 5 * MiB, 65_537]
    sent = []
    for size in sizes:
        body = (os.urandom(64) * (size // 64 + 1))[:size]
        sent.append(body)
        client.publish(1, "", queue, body)
    tag = 0
    while tag < len(sizes):
        tag = max(tag, client.expect(commands.Basic.Ack, 1, timeout=20).delivery_tag)
    for body in sent:
        got = client.get_message(1, queue)
        assert got is not None and got[2] == body
    assert client.get_message(1, queue) is None
    client.close()


@pytest.mark.timeout(120)
def test_two_hundred_busy_connections_leave_no_threads_or_descriptors(fresh_broker) -> None:
    before_threads, before_fds = baseline(fresh_broker)
    queue = uid("many")
    ends = ("close", "eof", "reset")
    for i in range(200):
        client = busy_client(fresh_broker, queue, routing_key=uid("nowhere"))
        if i == 0 and READER_THREADS:
            assert eventually(lambda: threads(fresh_broker.pid) > before_threads), "no reader thread"
        end = ends[i % 3]
        if end == "close":
            client.send(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
            client.expect(commands.Connection.CloseOk, 0)
            client.close()
        elif end == "eof":
            client.sock.shutdown(socket.SHUT_WR)
            assert client.wait_closed(10)
            client.close()
        else:
            client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()
    assert eventually(lambda: threads(fresh_broker.pid) <= before_threads), \
        f"{threads(fresh_broker.pid)} threads, {before_threads} before"
    assert eventually(lambda: fds(fresh_broker.pid) <= before_fds), f"{fds(fresh_broker.pid)} fds, {before_fds} before"
    assert_witness_served(fresh_broker.url, 0.5)


@pytest.mark.parametrize("end", ["eof", "reset", "bad_frame_end"])
def test_a_threaded_connection_ending_mid_frame(fresh_broker, end: str) -> None:
    before_threads, before_fds = baseline(fresh_broker)
    queue = uid("mid")
    client = busy_client(fresh_broker, queue)
    if READER_THREADS:
        assert eventually(lambda: threads(fresh_broker.pid) > before_threads), "no reader thread"
    stored = PAST_SWITCH // BODY
    whole, _ = publishes(client, queue, BODY, first=10_000)
    client.send_raw(whole[: len(whole) - BODY // 2])  # the last body frame cut in half
    if end == "eof":
        client.sock.shutdown(socket.SHUT_WR)
        assert client.wait_closed(10), "the broker kept a connection whose client had sent EOF"
    elif end == "reset":
        client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    else:  # the rest of the frame, with a wrong frame-end octet: connection.close 501
        client.send_raw(whole[len(whole) - BODY // 2: -1] + b"\x00")
        assert client.expect_connection_close(timeout=10).reply_code == 501
    client.close()
    assert eventually(lambda: threads(fresh_broker.pid) <= before_threads)
    assert eventually(lambda: fds(fresh_broker.pid) <= before_fds)
    check = raw_client(fresh_broker)
    assert message_count(check, queue) == stored  # the cut message was not stored
    check.close()
    assert_witness_served(fresh_broker.url, 0.5)


def test_flooding_publisher_whose_output_is_backed_up(fresh_broker) -> None:
    before_threads, _ = baseline(fresh_broker)
    before = rss_anon(fresh_broker.pid)
    publisher = raw_client(fresh_broker, rcvbuf=4096)  # never reads: its returns back up
    data, _ = publishes(publisher, uid("warm"), PAST_SWITCH)
    publisher.send_raw(data)
    round_trip(publisher)
    if READER_THREADS:
        assert eventually(lambda: threads(fresh_broker.pid) > before_threads), "no reader thread"
    try:
        assert_unread_returns_stop_the_publisher(fresh_broker, publisher, before)
    finally:
        publisher.close()


def test_resource_alarm_blocks_a_threaded_connection(inproc) -> None:  # noqa: F811 - the fixture
    b = inproc()
    me = os.getpid()  # the broker runs in this process
    queue = uid("alarm")
    raw = RawAMQP("127.0.0.1", b.port)
    before_threads = threads(me)
    raw.handshake()
    raw.open_channel(1)
    raw.call(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
    raw.call(1, commands.Queue.Declare(queue=queue), commands.Queue.DeclareOk)
    data, first = publishes(raw, queue, PAST_SWITCH)
    raw.send_raw(data)
    tag = 0
    while tag < first:
        tag = raw.expect(commands.Basic.Ack, 1, timeout=10).delivery_tag
    if READER_THREADS:
        assert eventually(lambda: threads(me) > before_threads), "no reader thread"
    b.call(b.broker.set_resource_limits, memory_high_watermark="1MiB")  # far below any Python process
    raw.expect(commands.Connection.Blocked, 0, timeout=5)
    flood, more = publishes(raw, queue, 48 * MiB, first=first)
    sending = socket.socket(fileno=os.dup(raw.sock.fileno()))  # its own timeout; the same connection
    sending.settimeout(60)
    sender = threading.Thread(target=sending.sendall, args=(flood,), daemon=True)
    sender.start()
    try:
        sender.join(2.0)
        assert sender.is_alive(), "the broker read 48 MiB from a blocked publisher"
        assert b.call(lambda: b.broker.vhosts["/"].queues[queue].message_count) == first
        b.call(b.broker.set_resource_limits, memory_high_watermark="1.0")  # all of RAM: cleared
        raw.expect(commands.Connection.Unblocked, 0, timeout=5)
        sender.join(30)
        assert not sender.is_alive()
        while tag < first + more:
            tag = raw.expect(commands.Basic.Ack, 1, timeout=20).delivery_tag
        assert b.call(lambda: b.broker.vhosts["/"].queues[queue].message_count) == first + more
    finally:
        sending.close()
        raw.close()


def test_heartbeats_on_a_threaded_connection(fresh_broker) -> None:
    before_threads, _ = baseline(fresh_broker)
    client = busy_client(fresh_broker, uid("hb"), heartbeat_s=1)
    if READER_THREADS:
        assert eventually(lambda: threads(fresh_broker.pid) > before_threads), "no reader thread"
    deadline = time.monotonic() + 3.5  # the client's heartbeats, read by the thread, keep it open
    while time.monotonic() < deadline:
        client.send_heartbeat()
        try:
            client.recv(timeout=0.3)
        except TimeoutError:
            pass
    round_trip(client)
    assert client.heartbeats_seen >= 2, "the broker sent no heartbeats"
    t0 = time.monotonic()  # silent now: dropped after two missed checks, as RabbitMQ does
    with pytest.raises(PeerClosed):
        while True:
            client.recv(timeout=8)
    assert time.monotonic() - t0 <= 5
    client.close()
    assert eventually(lambda: threads(fresh_broker.pid) <= before_threads)


def test_mixed_large_and_small_bodies_reach_a_slow_consumer_whole_and_in_order(fresh_broker) -> None:
    """A consumer's output past the writer thread's switch, large multi-frame bodies (their frames go
    to the thread as slices with the frame heads between them, in batches the high-water mark bounds)
    mixed with small ones in the same delivery runs, and a consumer that reads more slowly than the
    publisher sends, so that its output backs up and waits: every body arrives whole, in order."""
    queue = uid("mixed")
    publisher = RawAMQP(fresh_broker.host, fresh_broker.port)
    publisher.handshake()
    publisher.open_channel(1)
    publisher.call(1, commands.Queue.Declare(queue=queue), commands.Queue.DeclareOk)
    publisher.call(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
    sizes = [MiB + 3, 10, 64 * 1024, 0, 3 * MiB, 200_000, 7, 131_064, 2 * MiB + 1] * 4
    sent = [i.to_bytes(4, "big") * (size // 4) + b"t" * (size % 4) for i, size in enumerate(sizes)]
    consumer = RawAMQP(fresh_broker.host, fresh_broker.port)
    consumer.handshake()  # frame_max 128 KiB: large bodies in several frames
    consumer.open_channel(1)
    consumer.send(1, commands.Basic.Consume(queue=queue, no_ack=True))
    consumer.expect(commands.Basic.ConsumeOk, 1)
    for body in sent:
        publisher.publish(1, "", queue, body)
    got = []
    for _ in sent:
        consumer.expect(commands.Basic.Deliver, 1, timeout=30)
        hdr = consumer.expect(header.ContentHeader, 1, timeout=30)
        body = b""
        while len(body) < hdr.body_size:
            body += consumer.expect(ContentBody, 1, timeout=30).value
            time.sleep(0.001)  # slower than the publisher: the broker's output backs up
        got.append(body)
    assert [len(b) for b in got] == [len(b) for b in sent]
    assert got == sent
    tag = 0
    while tag < len(sent):
        tag = max(tag, publisher.expect(commands.Basic.Ack, 1, timeout=30).delivery_tag)
    publisher.close()
    consumer.close()
