"""Stream filtering over TCP with pika: LavinMQ's forms and RabbitMQ's, exact (a consumer gets every
matching message and no other, so it need not filter again)."""

from __future__ import annotations

import pika
import pytest

from . import uid
from .conftest import lavinpy_only

pytestmark = lavinpy_only("stream filtering (exact) is lavinpy's")

MESSAGES = [("eu", {}), ("us", {}), ("eu,prio", {}), (None, {"level": "error"}), ("us", {"level": "error"}),
            (None, {})]


def _consume(ch, stream: str, arguments: dict, expected: int) -> list[bytes]:
    got: list[bytes] = []
    tag = ch.basic_consume(stream, lambda c, m, p, body: (got.append(body), c.basic_ack(m.delivery_tag)),
                           arguments={"x-stream-offset": "first", **arguments})
    deadline = 50
    while len(got) < expected and deadline:
        ch.connection.process_data_events(0.1)
        deadline -= 1
    ch.connection.process_data_events(0.3)  # nothing more comes
    ch.basic_cancel(tag)
    return got


@pytest.mark.parametrize(("arguments", "bodies"), [
    ({"x-stream-filter": "eu"}, [b"0", b"2"]),
    ({"x-stream-filter": "eu,prio"}, [b"2"]),
    ({"x-stream-filter": "eu,us", "x-filter-match-type": "any"}, [b"0", b"1", b"2", b"4"]),
    ({"x-stream-filter": ["eu", "us"]}, [b"0", b"1", b"2", b"4"]),  # RabbitMQ's array: any
    ({"x-stream-filter": "us", "x-stream-match-unfiltered": True}, [b"1", b"3", b"4", b"5"]),
    ({"x-stream-filter": {"level": "error"}}, [b"3", b"4"]),
    ({"x-stream-filter": ["us", {"level": "error"}]}, [b"4"]),
    ({}, [b"0", b"1", b"2", b"3", b"4", b"5"]),
])
def test_filters(clients, arguments, bodies):
    conn, ch = clients.channel()
    stream = clients.track_queue(uid("filtered"))
    ch.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
    ch.confirm_delivery()
    for i, (value, headers) in enumerate(MESSAGES):
        if value is not None:
            headers = {**headers, "x-stream-filter-value": value}
        ch.basic_publish("", stream, str(i).encode(), pika.BasicProperties(headers=headers or None))
    ch.basic_qos(prefetch_count=2)
    assert _consume(ch, stream, arguments, len(bodies)) == bodies


def test_a_bad_filter_is_refused_with_its_name(clients):
    import pika.exceptions

    conn, ch = clients.channel()
    stream = clients.track_queue(uid("filtered"))
    ch.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
    ch.basic_qos(prefetch_count=2)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        ch.basic_consume(stream, lambda *a: None, arguments={"x-stream-filter": "a", "x-filter-match-type": "x"})
        conn.process_data_events(1)
    assert (refused.value.reply_code, refused.value.reply_text) == (
        406, "PRECONDITION_FAILED - x-filter-match-type must be 'any' or 'all'")
