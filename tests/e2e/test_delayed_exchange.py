"""Exchange type x-delayed-message: x-delay holds a message until due, across restarts."""

from __future__ import annotations

import asyncio
import itertools
import time

import aio_pika
import pika
import pytest

from . import bodies, channel_closed, get_all, persistent, settle, uid, wait_until
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
    # A message is due when the broker held it plus its delay; the client knows that moment only between
    # its publish and the confirm, so each message has a window of due times (a message without x-delay is
    # routed within its window). The broker must route none before its window opens, and never one
    # before another whose window closes before its own opens. Stalls on a loaded machine widen the
    # windows; they cannot make a correct broker fail.
    conn, ch = clients.channel()
    ex, q = _setup(ch, clients)
    ch.confirm_delivery()
    arrived: list[tuple[bytes, float, dict]] = []
    ch.basic_consume(q, lambda _ch, _method, props, body: arrived.append((body, time.time(), props.headers or {})),
                     auto_ack=True)
    windows: dict[bytes, tuple[float, float]] = {}
    for body, delay in ((b"late", 600), (b"early", 250), (b"now", 0)):
        before = time.time()
        ch.basic_publish(ex, "k", body, pika.BasicProperties(headers={"x-delay": delay} if delay else None))
        windows[body] = (before + delay / 1000, time.time() + delay / 1000)
    ch.basic_publish(ex, "other", b"unrouted", pika.BasicProperties(headers={"x-delay": 100}))
    assert wait_until(conn, lambda: len(arrived) >= 3, 30)
    settle(conn, 0.2)
    assert sorted(body for body, _at, _headers in arrived) == sorted(windows)
    for body, at, headers in arrived:
        opens, _closes = windows[body]
        assert at >= opens - 0.002, body  # the broker's clock truncates to whole ms
        assert headers.get("x-delay") == (-600 if body == b"late" else -250 if body == b"early" else None)
    routed = [body for body, _at, _headers in arrived]
    for first, then in itertools.combinations(routed, 2):  # without stalls the windows fix now, early, late
        assert windows[first][0] <= windows[then][1], f"{first!r} was due after {then!r}, and routed before it"


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
