"""TTL: per-message expiration, x-message-ttl (the smaller wins), x-expires, expiry across restarts."""

from __future__ import annotations

import time

import aio_pika
import pika
import pytest

from . import bodies, channel_closed, consume, get_all, persistent, settle, uid, wait_until
from .conftest import lavinpy_only


def _count(ch, q: str) -> int:
    return ch.queue_declare(q, passive=True).method.message_count


def test_message_expiration_and_queue_ttl_smaller_wins(clients):
    conn, ch = clients.channel()
    q = ch.queue_declare(uid("q"), exclusive=True, arguments={"x-message-ttl": 300}).method.queue
    ch.basic_publish("", q, b"queue-ttl")  # expires after 300 ms
    ch.basic_publish("", q, b"long", pika.BasicProperties(expiration="60000"))  # queue TTL is smaller
    ch.basic_publish("", q, b"short", pika.BasicProperties(expiration="100"))
    ch.basic_publish("", q, b"kept-briefly", pika.BasicProperties(expiration="5000"))
    assert _count(ch, q) == 4
    time.sleep(0.45)
    # Every message had at most 300 ms to live: none is delivered, and the timer removed them.
    assert get_all(ch, q) == []
    assert wait_until(conn, lambda: _count(ch, q) == 0, 2)


def test_expired_messages_are_never_delivered_and_fresh_ones_are(clients):
    conn, ch = clients.channel()
    q = ch.queue_declare(uid("q"), exclusive=True).method.queue
    ch.basic_publish("", q, b"dies", pika.BasicProperties(expiration="50"))
    ch.basic_publish("", q, b"lives")
    time.sleep(0.15)
    got = consume(conn, ch, q, 1, timeout=1, auto_ack=True)
    assert bodies(got) == [b"lives"]
    # expiration 0: expired at once unless a consumer can take it immediately
    ch.basic_publish("", q, b"zero", pika.BasicProperties(expiration="0"))
    settle(conn, 0.1)
    assert _count(ch, q) == 0


def test_expiration_zero_reaches_a_waiting_consumer(clients):
    conn, ch = clients.channel()
    q = ch.queue_declare(uid("q"), exclusive=True).method.queue
    got = []
    ch.basic_consume(q, lambda c, m, p, b: got.append(b), auto_ack=True)
    ch.basic_publish("", q, b"now", pika.BasicProperties(expiration="0"))
    assert wait_until(conn, lambda: got == [b"now"], 2)


def test_expired_message_is_dead_lettered_with_original_expiration(clients):
    conn, ch = clients.channel()
    dlq = ch.queue_declare(uid("dlq"), exclusive=True).method.queue
    q = ch.queue_declare(uid("q"), exclusive=True, arguments={
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}).method.queue
    ch.basic_publish("", q, b"x", pika.BasicProperties(expiration="80", headers={"h": 1}))
    assert wait_until(conn, lambda: _count(ch, dlq) == 1, 3)
    [(method, props, body)] = get_all(ch, dlq)
    assert body == b"x" and method.routing_key == dlq and method.exchange == ""
    assert props.expiration is None and props.headers["h"] == 1
    [death] = props.headers["x-death"]
    assert death["reason"] == "expired" and death["queue"] == q and death["count"] == 1
    assert death["original-expiration"] == "80" and death["routing-keys"] == [q]
    assert props.headers["x-first-death-reason"] == "expired"


@pytest.mark.parametrize("bad", ["abc", "-1", "10x", "315360000001"])
def test_invalid_expiration_is_406(clients, bad):
    _, ch = clients.channel()
    q = ch.queue_declare(uid("q"), exclusive=True).method.queue
    with channel_closed(406, "expiration") as c:
        ch.basic_publish("", q, b"x", pika.BasicProperties(expiration=bad))
        ch.queue_declare(q, passive=True)
    assert f"'{bad}'" in c.reply_text


@pytest.mark.parametrize("args, name", [({"x-message-ttl": -1}, "x-message-ttl"),
                                        ({"x-message-ttl": "1000"}, "x-message-ttl"),
                                        ({"x-expires": 0}, "x-expires")])
def test_invalid_ttl_arguments_are_406(clients, args, name):
    _, ch = clients.channel()
    with channel_closed(406) as c:
        ch.queue_declare(uid("q"), exclusive=True, arguments=args)
    assert f"'{name}'" in c.reply_text


def test_x_expires_deletes_an_unused_queue(clients):
    conn, ch = clients.channel()
    q = clients.track_queue(uid("q"))
    ch.queue_declare(q, arguments={"x-expires": 400})
    # a consumer keeps it alive
    tag = ch.basic_consume(q, lambda *a: None)
    settle(conn, 0.6)
    assert ch.queue_declare(q, passive=True)
    ch.basic_cancel(tag)
    # basic.get counts as use and restarts the timer
    settle(conn, 0.25)
    ch.basic_get(q)
    settle(conn, 0.25)
    assert ch.queue_declare(q, passive=True)
    settle(conn, 0.4)
    with channel_closed(404):
        ch.queue_declare(q, passive=True)


@lavinpy_only()
def test_ttl_survives_restart_and_expired_messages_leave_disk(fresh_broker, fresh_clients):
    conn, ch = fresh_clients.channel()
    ch.confirm_delivery()
    q = uid("q")
    dlq = uid("dlq")
    ch.queue_declare(dlq, durable=True)
    # A TTL long enough that a restart on a loaded machine finds both messages still there.
    ch.queue_declare(q, durable=True, arguments={"x-message-ttl": 4000, "x-dead-letter-exchange": "",
                                                 "x-dead-letter-routing-key": dlq})
    published = time.monotonic()
    ch.basic_publish("", q, b"old", persistent())
    ch.basic_publish("", q, b"short", persistent(expiration="300"))
    fresh_clients.close_connections()
    fresh_broker.restart()
    conn, ch = fresh_clients.channel()
    if time.monotonic() - published < 3.5:
        assert _count(ch, q) == 2
    # Expiry counts from the original publish, not from the restart.
    assert wait_until(conn, lambda: _count(ch, q) == 0 and _count(ch, dlq) == 2, 6)
    assert time.monotonic() - published < 8
    fresh_clients.close_connections()
    fresh_broker.restart()
    conn, ch = fresh_clients.channel()
    assert _count(ch, q) == 0
    got = get_all(ch, dlq)
    assert sorted(bodies(got)) == [b"old", b"short"]
    assert {m[1].headers["x-death"][0]["reason"] for m in got} == {"expired"}


def test_aio_pika_message_ttl(broker):
    import asyncio

    async def main():
        conn = await aio_pika.connect_robust(broker.url)
        async with conn:
            ch = await conn.channel()
            dlq = await ch.declare_queue(uid("dlq"), exclusive=True)
            q = await ch.declare_queue(uid("q"), exclusive=True, arguments={
                "x-message-ttl": 100, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq.name})
            await ch.default_exchange.publish(aio_pika.Message(b"a"), routing_key=q.name)
            await ch.default_exchange.publish(aio_pika.Message(b"b", expiration=0.05), routing_key=q.name)
            await asyncio.sleep(0.4)
            assert await q.get(fail=False) is None
            got = [await dlq.get(no_ack=True), await dlq.get(no_ack=True)]
            assert sorted(m.body for m in got) == [b"a", b"b"]
            assert all(m.headers["x-death"][0]["reason"] == "expired" for m in got)
    asyncio.run(asyncio.wait_for(main(), 30))
