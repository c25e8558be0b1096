"""Priority queues (x-max-priority): higher priority first, FIFO within a priority, across restarts."""

from __future__ import annotations

import asyncio

import aio_pika
import pika
import pytest

from . import bodies, channel_closed, consume, get_all, persistent, uid, wait_until
from .conftest import lavinpy_only

ORDER = [(1, b"p1-a"), (5, b"p5-a"), (None, b"none"), (1, b"p1-b"), (9, b"p9"), (5, b"p5-b"), (200, b"p200")]
# Priorities above x-max-priority (10) count as 10; no priority counts as 0.
EXPECTED = [b"p200", b"p9", b"p5-a", b"p5-b", b"p1-a", b"p1-b", b"none"]


def _publish(ch, q: str, props=pika.BasicProperties) -> None:
    for priority, body in ORDER:
        ch.basic_publish("", q, body, props(priority=priority))


def test_higher_priority_first_fifo_within(clients):
    conn, ch = clients.channel()
    q = ch.queue_declare(uid("q"), exclusive=True, arguments={"x-max-priority": 10}).method.queue
    ch.confirm_delivery()
    _publish(ch, q)
    assert bodies(get_all(ch, q)) == EXPECTED


def test_consumer_gets_priority_order_and_requeue_keeps_level(clients):
    conn, ch = clients.channel()
    q = ch.queue_declare(uid("q"), exclusive=True, arguments={"x-max-priority": 10}).method.queue
    ch.confirm_delivery()
    _publish(ch, q)
    m, _, body = ch.basic_get(q)
    assert body == b"p200"
    ch.basic_nack(m.delivery_tag, requeue=True)  # back at the head of its level
    ch.basic_qos(prefetch_count=100)
    got = consume(conn, ch, q, len(EXPECTED), auto_ack=True)
    assert bodies(got) == EXPECTED


@pytest.mark.parametrize("value", [256, -1, "5"])
def test_bad_max_priority_is_406(clients, value):
    _, ch = clients.channel()
    with channel_closed(406, "x-max-priority"):
        ch.queue_declare(uid("q"), exclusive=True, arguments={"x-max-priority": value})


@lavinpy_only()
def test_priority_order_survives_restart(fresh_broker, fresh_clients):
    conn, ch = fresh_clients.channel()
    ch.confirm_delivery()
    q = uid("q")
    ch.queue_declare(q, durable=True, arguments={"x-max-priority": 10})
    _publish(ch, q, persistent)
    fresh_clients.close_connections()
    fresh_broker.restart()
    conn, ch = fresh_clients.channel()
    ch.confirm_delivery()
    ch.basic_publish("", q, b"after", persistent(priority=9))
    assert bodies(get_all(ch, q)) == [b"p200", b"p9", b"after", *EXPECTED[2:]]


def test_aio_pika_priorities(broker):
    async def main():
        conn = await aio_pika.connect_robust(broker.url)
        async with conn:
            ch = await conn.channel()
            q = await ch.declare_queue(uid("q"), exclusive=True, arguments={"x-max-priority": 10})
            for priority, body in ORDER:
                await ch.default_exchange.publish(aio_pika.Message(body, priority=priority), routing_key=q.name)
            got = []
            for _ in ORDER:
                m = await q.get(no_ack=True)
                got.append(m.body)
            assert got == EXPECTED
    asyncio.run(asyncio.wait_for(main(), 30))


def test_priority_queue_with_waiting_consumer(clients):
    conn, ch = clients.channel()
    q = ch.queue_declare(uid("q"), exclusive=True, arguments={"x-max-priority": 3}).method.queue
    got = []
    ch.basic_consume(q, lambda c, m, p, b: got.append(b), auto_ack=True)
    ch.basic_publish("", q, b"x", pika.BasicProperties(priority=2))
    assert wait_until(conn, lambda: got == [b"x"], 2)
