"""Server-side offset tracking over TCP with pika (LavinMQ's named consumer tags): a consumer that
disconnects with unacknowledged messages, misses what is published meanwhile and comes back with its
tag gets exactly the unacknowledged and the new ones; the offsets per tag in the HTTP API and deleted
there; negative offsets; a caught-up filtering consumer gets only its matches; the offset survives
kill -9."""

from __future__ import annotations

import time
from urllib.parse import quote

import pika

from . import uid
from .conftest import http_call, lavinpy_only

pytestmark = lavinpy_only("stream offset tracking and exact filters are lavinpy's")


def _declare(conn: pika.BlockingConnection, stream: str) -> None:
    conn.channel().queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})


def _publish(conn: pika.BlockingConnection, stream: str, bodies: list[str], value: str | None = None) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    headers = {"x-stream-filter-value": value} if value else None
    for body in bodies:
        ch.basic_publish("", stream, body.encode(), pika.BasicProperties(headers=headers))
    ch.close()


def _take(conn: pika.BlockingConnection, stream: str, count: int, ack: int, tag: str = "reader",
          arguments: dict | None = None) -> list[str]:
    """Consume ``count`` messages with ``tag``, acknowledging the first ``ack`` of them."""
    ch = conn.channel()
    ch.basic_qos(prefetch_count=100)
    got: list[str] = []

    def on_message(c, method, props, body):
        got.append(body.decode())
        if len(got) <= ack:
            c.basic_ack(method.delivery_tag)

    ch.basic_consume(stream, on_message, consumer_tag=tag, arguments=arguments)
    deadline = time.monotonic() + 5
    while len(got) < count and time.monotonic() < deadline:
        conn.process_data_events(0.1)
    conn.process_data_events(0.3)  # and nothing more
    return got


def _offsets_path(stream: str) -> str:
    return f"/api/queues/%2F/{quote(stream, safe='')}/consumer_offsets"


def test_a_consumer_back_with_its_tag_gets_exactly_the_unacked_and_the_new(broker):
    stream = uid("tracked")
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        _declare(conn, stream)
        _publish(conn, stream, ["m1", "m2", "m3", "m4", "m5"])
        # First visit from the first message: m1, m2 and m4 acknowledged, m3 and m5 not.
        ch = conn.channel()
        ch.basic_qos(prefetch_count=100)
        got: list[str] = []
        ch.basic_consume(stream, lambda c, m, p, body: got.append(body.decode()) or (
            body in (b"m1", b"m2", b"m4") and c.basic_ack(m.delivery_tag)),
            consumer_tag="reader", arguments={"x-stream-offset": "first"})
        while len(got) < 5:
            conn.process_data_events(0.1)
        conn.process_data_events(0.2)  # the acks reach the broker
        status, rows, _ = http_call(broker, "GET", _offsets_path(stream))
        assert status == 200 and rows == [{"consumer_tag": "reader", "offset": 3, "consumers": 1}]
        status, body, _ = http_call(broker, "DELETE", _offsets_path(stream) + "/reader")
        assert status == 400 and "cancel it first" in body["reason"]
    finally:
        conn.close()
    other = pika.BlockingConnection(pika.URLParameters(broker.url))
    _publish(other, stream, ["m6", "m7"])  # published while the reader is away
    other.close()
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        # Back at its first unacked message: m3 and m5 (m4 was acknowledged), then the new ones.
        assert _take(conn, stream, 4, ack=4) == ["m3", "m5", "m6", "m7"]
        conn.close()
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        status, rows, _ = http_call(broker, "GET", _offsets_path(stream))
        assert rows == [{"consumer_tag": "reader", "offset": 8, "consumers": 0}]
        assert _take(conn, stream, 0, ack=0) == []  # nothing new: nothing again
        conn.close()
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        assert http_call(broker, "DELETE", _offsets_path(stream) + "/reader")[0] == 204
        assert http_call(broker, "DELETE", _offsets_path(stream) + "/reader")[0] == 404
        assert http_call(broker, "GET", _offsets_path(stream))[1] == []
        # Forgotten: the tag starts where its arguments say again (here the last two).
        assert _take(conn, stream, 2, ack=2, arguments={"x-stream-offset": -2}) == ["m6", "m7"]
    finally:
        conn.close()


def test_offsets_need_a_stream_and_read_permission_on_it(broker, clients):
    conn, ch = clients.channel()
    name = clients.track_queue(uid("classic"))
    ch.queue_declare(name)
    status, body, _ = http_call(broker, "GET", _offsets_path(name))
    assert status == 200 and body == []  # a classic queue keeps no offsets
    status, body, _ = http_call(broker, "DELETE", _offsets_path(name) + "/reader")
    assert status == 400 and "is not a stream" in body["reason"]
    stream = clients.track_queue(uid("guarded"))
    ch.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
    user = uid("no-read")
    assert http_call(broker, "PUT", f"/api/users/{user}", {"password": "pw", "tags": "management"})[0] in (201, 204)
    try:
        assert http_call(broker, "PUT", f"/api/permissions/%2F/{user}",
                         {"configure": ".*", "write": ".*", "read": "^$"})[0] in (201, 204)
        for method, path in (("GET", _offsets_path(stream)), ("DELETE", _offsets_path(stream) + "/reader")):
            status, body, _ = http_call(broker, method, path, user=user, password="pw")
            assert status == 401 and "read access" in body["reason"], (method, status, body)  # as RabbitMQ
    finally:
        http_call(broker, "DELETE", f"/api/users/{user}")


def test_a_caught_up_filtering_consumer_gets_only_its_matches(broker):
    stream = uid("live-filter")
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        _declare(conn, stream)
        ch = conn.channel()
        ch.basic_qos(prefetch_count=100)
        got: list[str] = []
        ch.basic_consume(stream, lambda c, m, p, body: (got.append(body.decode()), c.basic_ack(m.delivery_tag)),
                         arguments={"x-stream-filter": "eu"})
        conn.process_data_events(0.2)
        _publish(conn, stream, ["u1", "u2"], value="us")
        _publish(conn, stream, ["e1"], value="eu")
        _publish(conn, stream, ["n1"])
        _publish(conn, stream, ["e2", "e3"], value="eu,us")
        deadline = time.monotonic() + 5
        while len(got) < 3 and time.monotonic() < deadline:
            conn.process_data_events(0.1)
        conn.process_data_events(0.3)
        assert got == ["e1", "e2", "e3"]
    finally:
        conn.channel().queue_delete(stream)
        conn.close()


def test_the_tracked_offset_survives_kill9(fresh_broker):
    b = fresh_broker
    stream = "tracked-kill9"
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    _declare(conn, stream)
    _publish(conn, stream, ["m1", "m2", "m3"])
    assert _take(conn, stream, 3, ack=2, arguments={"x-stream-offset": "first"}) == ["m1", "m2", "m3"]
    conn.close()
    time.sleep(0.5)  # past the flush interval (written when the consumer left, too)
    b.kill9()
    b.start()
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    _publish(conn, stream, ["m4"])
    assert _take(conn, stream, 2, ack=2) == ["m3", "m4"]
    # Tracking off: the tag's offset is not used, the consumer starts at next.
    assert _take(conn, stream, 0, ack=0, tag="other-reader",
                 arguments={"x-stream-automatic-offset-tracking": False}) == []
    conn.close()
