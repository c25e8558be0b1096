"""Exchange type x-delayed-message: x-delay holds a message until due, across restarts."""

from __future__ import annotations

import asyncio
import time

import aio_pika
import pika
import pytest

from . import bodies, channel_closed, get_all, persistent, uid, wait_until
from .conftest import lavinpy_only


def _count(ch, q: str) -> int:
    return ch.queue_declare(q, passive=True).method.message_count


def _setup(ch, clients, durable=False, queue_args=None):
    ex = clients.track_exchange(uid("delayed"))
    ch.exchange_declare(ex, "x-delayed-message", durable=durable, arguments={"x-delayed-type": "direct"})
    q = uid("q")
    if durable:
        clients.track_queue(q)
        ch.queue_declare(q, durable=True, arguments=queue_args)
    else:
        ch.queue_declare(q, exclusive=True, arguments=queue_args)
    ch.queue_bind(q, ex, "k")
    return ex, q


def test_delayed_messages_are_routed_when_due_in_due_order(clients):
    conn, ch = clients.channel()
    ex, q = _setup(ch, clients)
    ch.confirm_delivery()
    start = time.monotonic()
    ch.basic_publish(ex, "k", b"late", pika.BasicProperties(headers={"x-delay": 600}))
    ch.basic_publish(ex, "k", b"early", pika.BasicProperties(headers={"x-delay": 250}))
    ch.basic_publish(ex, "k", b"now")  # no x-delay: routed at once
    ch.basic_publish(ex, "other", b"unrouted", pika.BasicProperties(headers={"x-delay": 100}))
    assert bodies(get_all(ch, q)) == [b"now"]
    assert wait_until(conn, lambda: _count(ch, q) == 1, 2)
    assert time.monotonic() - start >= 0.24
    [(method, props, body)] = get_all(ch, q)
    assert body == b"early" and props.headers["x-delay"] == -250 and method.exchange == ex
    assert wait_until(conn, lambda: _count(ch, q) == 1, 2)
    assert time.monotonic() - start >= 0.59
    assert bodies(get_all(ch, q)) == [b"late"]


def test_bad_delayed_type_is_406(clients):
    _, ch = clients.channel()
    with channel_closed(406, "x-delayed-type"):
        ch.exchange_declare(uid("d"), "x-delayed-message", arguments={"x-delayed-type": "nope"})
    _, ch = clients.channel()
    with channel_closed(406, "x-delayed-type"):
        ch.exchange_declare(uid("d"), "x-delayed-message")


def test_delayed_topic_exchange(clients):
    conn, ch = clients.channel()
    ex = clients.track_exchange(uid("delayed"))
    ch.exchange_declare(ex, "x-delayed-message", arguments={"x-delayed-type": "topic"})
    q = ch.queue_declare(uid("q"), exclusive=True).method.queue
    ch.queue_bind(q, ex, "a.*")
    ch.basic_publish(ex, "a.b", b"x", pika.BasicProperties(headers={"x-delay": 50}))
    assert wait_until(conn, lambda: _count(ch, q) == 1, 2)


@lavinpy_only()
def test_delayed_messages_survive_restart(fresh_broker, fresh_clients):
    conn, ch = fresh_clients.channel()
    ex, q = _setup(ch, fresh_clients, durable=True)
    ch.confirm_delivery()
    # The delays run from the publish, across the restart: long enough that a restart on a loaded
    # machine still finds both messages waiting.
    published = time.monotonic()
    for i, delay in enumerate((4000, 4300)):
        ch.basic_publish(ex, "k", str(i).encode(), persistent(headers={"x-delay": delay}))
    fresh_clients.close_connections()
    fresh_broker.restart()
    conn, ch = fresh_clients.channel()
    if time.monotonic() - published < 3.5:
        assert _count(ch, q) == 0
    assert wait_until(conn, lambda: _count(ch, q) == 2, 10)
    got = get_all(ch, q)
    assert bodies(got) == [b"0", b"1"]
    # routed once only: after another restart nothing comes back
    fresh_clients.close_connections()
    fresh_broker.restart()
    conn, ch = fresh_clients.channel()
    time.sleep(0.2)
    assert _count(ch, q) == 0


@lavinpy_only()
def test_many_waiting_delayed_messages_cost_no_cpu(broker, clients):
    import os
    conn, ch = clients.channel()
    ex, q = _setup(ch, clients)
    ch.confirm_delivery()
    for i in range(300):
        ch.basic_publish(ex, "k", b"x", pika.BasicProperties(headers={"x-delay": 60000 + i}))
    clock = os.sysconf("SC_CLK_TCK")

    def cpu() -> float:
        with open(f"/proc/{broker.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / clock
    before = cpu()
    time.sleep(1.0)
    assert cpu() - before < 0.15  # idle apart from the flusher; no per-message polling
    ch.exchange_delete(ex)


def test_aio_pika_delayed(broker):
    async def main():
        conn = await aio_pika.connect_robust(broker.url)
        async with conn:
            ch = await conn.channel()
            ex = await ch.declare_exchange(uid("delayed"), "x-delayed-message", arguments={"x-delayed-type": "fanout"})
            q = await ch.declare_queue(uid("q"), exclusive=True)
            await q.bind(ex)
            await ex.publish(aio_pika.Message(b"d", headers={"x-delay": 200}), routing_key="")
            assert await q.get(fail=False) is None
            await asyncio.sleep(0.4)
            m = await q.get(no_ack=True)
            assert m.body == b"d" and m.headers["x-delay"] == -200
            await ex.delete()
    asyncio.run(asyncio.wait_for(main(), 30))


@pytest.mark.parametrize("delay", [0, -5, "abc"])
def test_no_positive_delay_routes_at_once(clients, delay):
    _, ch = clients.channel()
    ex, q = _setup(ch, clients)
    ch.confirm_delivery()
    ch.basic_publish(ex, "k", b"x", pika.BasicProperties(headers={"x-delay": delay}))
    assert bodies(get_all(ch, q)) == [b"x"]
