"""Stream queues through pika: offsets, the x-stream-offset header, restarts, retention, refusals."""

from __future__ import annotations

import shutil
import time
from datetime import UTC

import pytest

from . import channel_closed, connection_closed, uid, wait_until
from .conftest import lavinpy_only

STREAM = {"x-queue-type": "stream"}


def read_stream(conn, ch, queue: str, offset, n: int, prefetch: int = 50) -> list[tuple[int, bytes]]:
    """Consume n messages from a stream starting at ``offset``: [(x-stream-offset, body)]."""
    ch.basic_qos(prefetch_count=prefetch)
    got: list[tuple[int, bytes]] = []

    def on_message(c, method, props, body):
        got.append((props.headers["x-stream-offset"], body))
        c.basic_ack(method.delivery_tag)

    tag = ch.basic_consume(queue, on_message, arguments={"x-stream-offset": offset})
    assert wait_until(conn, lambda: len(got) >= n, timeout=10), f"got {len(got)} of {n}"
    ch.basic_cancel(tag)
    return got[:n]


def test_offsets_start_at_one_and_every_delivery_carries_its_offset(clients):
    conn, ch = clients.channel()
    q = clients.track_queue(uid("st"))
    ch.queue_declare(q, durable=True, arguments=STREAM)
    for i in range(20):
        ch.basic_publish("", q, f"m{i}".encode())
    assert ch.queue_declare(q, durable=True, arguments=STREAM).method.message_count == 20
    assert read_stream(conn, ch, q, "first", 20) == [(i + 1, f"m{i}".encode()) for i in range(20)]
    assert read_stream(conn, ch, q, 15, 6) == [(i + 1, f"m{i}".encode()) for i in range(14, 20)]
    assert read_stream(conn, ch, q, "last", 1) == [(20, b"m19")]
    # reading never removes anything
    assert ch.queue_declare(q, passive=True).method.message_count == 20


def test_next_only_sees_new_messages_and_two_consumers_read_independently(clients):
    conn, ch = clients.channel()
    q = clients.track_queue(uid("st"))
    ch.queue_declare(q, durable=True, arguments=STREAM)
    for i in range(5):
        ch.basic_publish("", q, f"old{i}".encode())
    ch.basic_qos(prefetch_count=10)
    new: list[bytes] = []
    ch.basic_consume(q, lambda c, m, p, b: (new.append(b), c.basic_ack(m.delivery_tag)),
                     arguments={"x-stream-offset": "next"})
    ch.queue_declare(q, passive=True)  # consume-ok processed
    _, ch2 = clients.channel()
    for i in range(3):
        ch2.basic_publish("", q, f"new{i}".encode())
    assert wait_until(conn, lambda: len(new) == 3)
    assert new == [b"new0", b"new1", b"new2"]
    everything = read_stream(conn, conn.channel(), q, "first", 8)
    assert [b for _, b in everything] == [b"old0", b"old1", b"old2", b"old3", b"old4",
                                          b"new0", b"new1", b"new2"]


def test_timestamp_offset_starts_at_the_first_message_of_that_time(clients):
    conn, ch = clients.channel()
    q = clients.track_queue(uid("st"))
    ch.queue_declare(q, durable=True, arguments=STREAM)
    ch.basic_publish("", q, b"before")
    time.sleep(1.1)
    cut = int(time.time())
    time.sleep(0.05)
    ch.basic_publish("", q, b"after")
    from datetime import datetime

    got = read_stream(conn, ch, q, datetime.fromtimestamp(cut, tz=UTC), 1)
    assert got == [(2, b"after")]


@lavinpy_only("restarts the server")
def test_old_offsets_return_the_same_messages_after_a_restart(fresh_broker, fresh_clients):
    conn, ch = fresh_clients.channel()
    q = uid("st")
    ch.queue_declare(q, durable=True, arguments=STREAM)
    ch.confirm_delivery()
    for i in range(50):
        ch.basic_publish("", q, f"m{i}".encode())
    before = read_stream(conn, ch, q, 10, 41)
    fresh_clients.close_connections()
    fresh_broker.restart()
    conn, ch = fresh_clients.channel()
    assert ch.queue_declare(q, durable=True, arguments=STREAM).method.message_count == 50
    assert read_stream(conn, ch, q, 10, 41) == before
    ch.basic_publish("", q, b"after-restart")
    assert read_stream(conn, ch, q, "last", 1) == [(51, b"after-restart")]


@lavinpy_only("uses a small segment size")
def test_retention_by_bytes_removes_whole_segments_from_the_head(fresh_broker, fresh_clients):
    config = fresh_broker.workdir / "small-segments.yaml"
    config.write_text("segment_size: 65536\n")
    fresh_clients.close_connections()
    fresh_broker.stop()
    shutil.rmtree(fresh_broker.data_dir)  # the segment already made would stay 8 MiB
    fresh_broker.extra_args = ["--config", str(config)]
    fresh_broker.start()
    conn, ch = fresh_clients.channel()
    q = uid("st")
    ch.queue_declare(q, durable=True, arguments={**STREAM, "x-max-length-bytes": 200_000})
    ch.confirm_delivery()
    body = b"x" * 1000
    for _ in range(1000):  # ~1 MB: about 16 segments of 64 KiB
        ch.basic_publish("", q, body)
    count = ch.queue_declare(q, passive=True).method.message_count
    assert 150 <= count < 600, count
    time.sleep(0.6)  # several of the vhost's periodic ticks: size retention runs only on a segment roll
    assert ch.queue_declare(q, passive=True).method.message_count == count
    first = read_stream(conn, ch, q, "first", 1)[0][0]
    assert first > 1 and first + count - 1 == 1000  # the head went, offsets did not move
    assert read_stream(conn, ch, q, "last", 1) == [(1000, body)]
    segments = list((fresh_broker.data_dir).rglob("msgs.*"))
    assert len(segments) < 10


def test_stream_consumer_needs_a_prefetch(clients):
    conn, ch = clients.channel()
    q = clients.track_queue(uid("st"))
    ch.queue_declare(q, durable=True, arguments=STREAM)
    with channel_closed(406, "prefetch"):
        ch.basic_consume(q, lambda *a: None, arguments={"x-stream-offset": "first"})


def test_stream_refuses_no_ack_get_and_purge(clients):
    q = uid("st")
    conn, ch = clients.channel()
    ch.queue_declare(q, durable=True, arguments=STREAM)
    clients.track_queue(q)
    ch.basic_qos(prefetch_count=10)
    with connection_closed(540):
        ch.basic_consume(q, lambda *a: None, auto_ack=True)
    conn, ch = clients.channel()
    with connection_closed(540):
        ch.basic_get(q)
    conn, ch = clients.channel()
    with connection_closed(540):
        ch.queue_purge(q)


@pytest.mark.parametrize("flags", [{"durable": False}, {"durable": True, "exclusive": True},
                                   {"durable": True, "auto_delete": True}])
def test_stream_must_be_durable_and_shared(clients, flags):
    conn, ch = clients.channel()
    with channel_closed(406):
        ch.queue_declare(uid("st"), arguments=STREAM, **flags)
