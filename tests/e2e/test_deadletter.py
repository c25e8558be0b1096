"""Dead-lettering: reasons, x-death history, routing keys, cycles, the delivery limit, restarts."""

from __future__ import annotations

import asyncio

import aio_pika
import pika

from . import bodies, channel_closed, get_all, persistent, settle, uid, wait_until
from .conftest import lavinpy_only


def _count(ch, q: str) -> int:
    return ch.queue_declare(q, passive=True).method.message_count


def _dlx_pair(ch, clients, **extra):
    """A fanout DLX with a bound queue, and a source queue dead-lettering to it."""
    dlx = clients.track_exchange(uid("dlx"))
    ch.exchange_declare(dlx, "fanout")
    dlq = ch.queue_declare(uid("dlq"), exclusive=True).method.queue
    ch.queue_bind(dlq, dlx)
    q = ch.queue_declare(uid("q"), exclusive=True, arguments={"x-dead-letter-exchange": dlx, **extra}).method.queue
    return dlx, dlq, q


def test_reject_and_nack_without_requeue_dead_letter(clients):
    conn, ch = clients.channel()
    dlx, dlq, q = _dlx_pair(ch, clients)
    ch.basic_publish("", q, b"r", pika.BasicProperties(headers={"CC": ["cc-key"]}))
    ch.basic_publish("", q, b"n")
    ch.basic_publish("", q, b"requeued")
    m1, _, _ = ch.basic_get(q)
    ch.basic_reject(m1.delivery_tag, requeue=False)
    m2, _, _ = ch.basic_get(q)
    ch.basic_nack(m2.delivery_tag, requeue=False)
    m3, _, _ = ch.basic_get(q)
    ch.basic_nack(m3.delivery_tag, requeue=True)  # requeued: not dead-lettered
    assert wait_until(conn, lambda: _count(ch, dlq) == 2, 2)
    got = get_all(ch, dlq)
    assert bodies(got) == [b"r", b"n"]
    method, props, _ = got[0]
    # routed to the DLX with the original routing key; exchange is the DLX
    assert (method.exchange, method.routing_key) == (dlx, q)
    [death] = props.headers["x-death"]
    assert death["reason"] == "rejected" and death["queue"] == q and death["exchange"] == ""
    assert death["routing-keys"] == [q, "cc-key"] and death["count"] == 1
    assert "original-expiration" not in death
    assert props.headers["x-first-death-reason"] == "rejected"
    assert props.headers["x-first-death-queue"] == q
    assert props.headers["x-first-death-exchange"] == ""
    assert _count(ch, q) == 1


def test_dead_letter_routing_key_and_missing_dlx(clients):
    conn, ch = clients.channel()
    target = ch.queue_declare(uid("t"), exclusive=True).method.queue
    q = ch.queue_declare(uid("q"), exclusive=True, arguments={
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": target}).method.queue
    ch.basic_publish("", q, b"x")
    m, _, _ = ch.basic_get(q)
    ch.basic_reject(m.delivery_tag, requeue=False)
    assert wait_until(conn, lambda: _count(ch, target) == 1, 2)
    [(method, props, _)] = get_all(ch, target)
    assert method.routing_key == target and props.headers["x-death"][0]["routing-keys"] == [q]
    # a DLX that does not exist: the message is simply dropped
    q2 = ch.queue_declare(uid("q"), exclusive=True, arguments={"x-dead-letter-exchange": uid("nope")}).method.queue
    ch.basic_publish("", q2, b"x")
    m, _, _ = ch.basic_get(q2)
    ch.basic_reject(m.delivery_tag, requeue=False)
    settle(conn, 0.1)
    assert _count(ch, q2) == 0


def test_x_death_counts_merge_by_queue_and_reason(clients):
    """A message rejected twice from the same queue has one x-death entry with count 2."""
    conn, ch = clients.channel()
    a = uid("a")
    b = ch.queue_declare(uid("b"), exclusive=True, arguments={
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": a}).method.queue
    ch.queue_declare(a, exclusive=True, arguments={"x-dead-letter-exchange": "",
                                                   "x-dead-letter-routing-key": b})
    ch.basic_publish("", a, b"ping")
    for expected_queue in (b, a, b):  # a -> b -> a -> b, rejected each time (client cycles are allowed)
        source = a if expected_queue == b else b
        m, _, _ = ch.basic_get(source)
        ch.basic_reject(m.delivery_tag, requeue=False)
        assert wait_until(conn, lambda q=expected_queue: _count(ch, q) == 1, 2)
    m, props, _ = ch.basic_get(b, auto_ack=True)
    deaths = props.headers["x-death"]
    assert [(d["queue"], d["reason"], d["count"]) for d in deaths] == [(a, "rejected", 2), (b, "rejected", 1)]
    assert props.headers["x-first-death-queue"] == a
    assert props.headers["x-last-death-queue"] == a


def test_automatic_cycle_is_dropped(clients):
    """Expiry back into the same queue (no client rejection in the cycle) drops the message."""
    conn, ch = clients.channel()
    q = uid("q")
    ch.queue_declare(q, exclusive=True, arguments={"x-message-ttl": 50, "x-dead-letter-exchange": ""})
    ch.basic_publish("", q, b"loop")
    settle(conn, 0.4)
    assert _count(ch, q) == 0


def test_delivery_limit_dead_letters_after_three_attempts(clients):
    conn, ch = clients.channel()
    dlx, dlq, q = _dlx_pair(ch, clients, **{"x-delivery-limit": 2})
    ch.basic_publish("", q, b"job")
    counts = []
    for _ in range(3):
        assert wait_until(conn, lambda: _count(ch, q) == 1, 2)
        m, props, body = ch.basic_get(q)
        counts.append((props.headers or {}).get("x-delivery-count"))
        ch.basic_nack(m.delivery_tag, requeue=True)
    assert counts == [None, 1, 2]
    assert wait_until(conn, lambda: _count(ch, dlq) == 1, 2)
    assert _count(ch, q) == 0
    [(_, props, body)] = get_all(ch, dlq)
    assert body == b"job" and props.headers["x-death"][0]["reason"] == "delivery_limit"


def test_delivery_limit_counts_channel_closes(clients):
    conn, ch = clients.channel()
    dlx, dlq, q = _dlx_pair(ch, clients, **{"x-delivery-limit": 0})
    ch.basic_publish("", q, b"x")
    ch2 = conn.channel()
    ch2.basic_get(q)
    ch2.close()  # the unacked delivery returns: over the limit, so dead-lettered
    assert wait_until(conn, lambda: _count(ch, dlq) == 1, 2)


def test_bad_dead_letter_arguments_are_406(clients):
    _, ch = clients.channel()
    with channel_closed(406, "x-dead-letter-routing-key"):
        ch.queue_declare(uid("q"), exclusive=True, arguments={"x-dead-letter-routing-key": "k"})
    _, ch = clients.channel()
    with channel_closed(406, "x-delivery-limit"):
        ch.queue_declare(uid("q"), exclusive=True, arguments={"x-delivery-limit": "3"})
    _, ch = clients.channel()
    with channel_closed(406, "x-dead-letter-exchange"):
        ch.queue_declare(uid("q"), exclusive=True, arguments={"x-dead-letter-exchange": 5})


@lavinpy_only()
def test_dead_lettered_state_survives_restart(fresh_broker, fresh_clients):
    conn, ch = fresh_clients.channel()
    ch.confirm_delivery()
    dlq, q = uid("dlq"), uid("q")
    ch.queue_declare(dlq, durable=True)
    ch.queue_declare(q, durable=True, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    for i in range(3):
        ch.basic_publish("", q, str(i).encode(), persistent())
    for _ in range(2):
        m, _, _ = ch.basic_get(q)
        ch.basic_reject(m.delivery_tag, requeue=False)
    assert wait_until(conn, lambda: _count(ch, dlq) == 2, 2)
    fresh_clients.close_connections()
    fresh_broker.restart()
    _, ch = fresh_clients.channel()
    assert _count(ch, q) == 1
    got = get_all(ch, dlq)
    assert bodies(got) == [b"0", b"1"]
    assert [m[1].headers["x-death"][0]["reason"] for m in got] == ["rejected", "rejected"]
    assert [m[1].delivery_mode for m in got] == [2, 2]


def test_aio_pika_reject_to_dlx_with_delivery_limit(broker):
    async def main():
        conn = await aio_pika.connect_robust(broker.url)
        async with conn:
            ch = await conn.channel()
            dlq = await ch.declare_queue(uid("dlq"), exclusive=True)
            q = await ch.declare_queue(uid("q"), exclusive=True, arguments={
                "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq.name, "x-delivery-limit": 1})
            await ch.default_exchange.publish(aio_pika.Message(b"a"), routing_key=q.name)
            await ch.default_exchange.publish(aio_pika.Message(b"b"), routing_key=q.name)
            m = await q.get()
            await m.reject(requeue=False)
            for expected in (None, 1):
                m = await q.get()
                assert m.body == b"b" and (m.headers or {}).get("x-delivery-count") == expected
                await m.nack(requeue=True)
            await asyncio.sleep(0.1)
            got = [await dlq.get(no_ack=True), await dlq.get(no_ack=True)]
            assert [(m.body, m.headers["x-death"][0]["reason"]) for m in got] == [
                (b"a", "rejected"), (b"b", "delivery_limit")]
    asyncio.run(asyncio.wait_for(main(), 30))
