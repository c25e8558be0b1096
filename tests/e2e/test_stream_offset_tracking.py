"""Server-side offset tracking over TCP with pika (LavinMQ's named consumer tags): a consumer that
disconnects with unacknowledged messages, misses what is published meanwhile and comes back with its
tag gets exactly the unacknowledged and the new ones; the offset survives kill -9."""

from __future__ import annotations

import time

import pika

from .conftest import lavinpy_only

pytestmark = lavinpy_only("kill -9 of a lavinpy started by the tests")

STREAM = "tracked-stream"


def _publish(conn: pika.BlockingConnection, bodies: list[str]) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish("", STREAM, body.encode())
    ch.close()


def _take(conn: pika.BlockingConnection, count: int, ack: int, tag: str = "reader",
          arguments: dict | None = None) -> list[str]:
    """Consume ``count`` messages with ``tag``, acknowledging the first ``ack`` of them."""
    ch = conn.channel()
    ch.basic_qos(prefetch_count=100)
    got: list[str] = []

    def on_message(c, method, props, body):
        got.append(body.decode())
        if len(got) <= ack:
            c.basic_ack(method.delivery_tag)

    ch.basic_consume(STREAM, on_message, consumer_tag=tag, arguments=arguments)
    deadline = time.monotonic() + 5
    while len(got) < count and time.monotonic() < deadline:
        conn.process_data_events(0.1)
    conn.process_data_events(0.3)  # and nothing more
    return got


def test_a_named_consumer_resumes_at_its_first_unacked_message_even_after_kill9(fresh_broker):
    b = fresh_broker
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    conn.channel().queue_declare(STREAM, durable=True, arguments={"x-queue-type": "stream"})
    _publish(conn, ["m1", "m2", "m3", "m4", "m5"])
    # First visit: from the first message, acknowledging m1..m3, leaving m4 and m5 unacked.
    assert _take(conn, 5, ack=3, arguments={"x-stream-offset": "first"}) == ["m1", "m2", "m3", "m4", "m5"]
    conn.close()
    other = pika.BlockingConnection(pika.URLParameters(b.url))
    _publish(other, ["m6", "m7"])  # published while the reader is away
    other.close()
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    assert _take(conn, 4, ack=4) == ["m4", "m5", "m6", "m7"]
    conn.close()
    time.sleep(0.5)  # past the flush interval (written when the consumer left, too)
    b.kill9()
    b.start()
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    _publish(conn, ["m8"])
    assert _take(conn, 1, ack=1) == ["m8"]
    # Tracking off: the tag's offset is not used, the consumer starts at next.
    assert _take(conn, 0, ack=0, tag="other-reader",
                 arguments={"x-stream-automatic-offset-tracking": False}) == []
    conn.close()
