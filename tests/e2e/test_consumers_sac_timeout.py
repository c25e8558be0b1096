"""Single active consumer and the consumer timeout."""

from __future__ import annotations

import asyncio
import time

import aio_pika

from . import channel_closed, settle, uid, wait_until
from .conftest import lavinpy_only


def _count(ch, q: str) -> int:
    return ch.queue_declare(q, passive=True).method.message_count


def test_single_active_consumer_takes_over_in_order(clients):
    conn, ch = clients.channel()
    q = ch.queue_declare(uid("q"), exclusive=True, arguments={"x-single-active-consumer": True}).method.queue
    got: dict[str, list[bytes]] = {"a": [], "b": [], "c": []}
    chans = {name: conn.channel() for name in got}
    tags = {}
    for name, c in chans.items():
        c.basic_qos(prefetch_count=1)
        tags[name] = c.basic_consume(q, lambda _c, m, p, b, n=name: (got[n].append(b), _c.basic_ack(m.delivery_tag)))
    for i in range(4):
        ch.basic_publish("", q, str(i).encode())
    assert wait_until(conn, lambda: len(got["a"]) == 4, 2)
    assert got["b"] == got["c"] == []
    chans["a"].basic_cancel(tags["a"])
    ch.basic_publish("", q, b"4")
    assert wait_until(conn, lambda: got["b"] == [b"4"], 2)
    chans["b"].close()  # a closed channel also hands over
    ch.basic_publish("", q, b"5")
    assert wait_until(conn, lambda: got["c"] == [b"5"], 2)


def test_single_active_consumer_unacked_stay_with_active(clients):
    conn, ch = clients.channel()
    q = ch.queue_declare(uid("q"), exclusive=True, arguments={"x-single-active-consumer": True}).method.queue
    first, second = conn.channel(), conn.channel()
    first.basic_qos(prefetch_count=1)
    a, b = [], []
    first.basic_consume(q, lambda _c, m, p, body: a.append(m))
    second.basic_consume(q, lambda _c, m, p, body: b.append(body), auto_ack=True)
    ch.basic_publish("", q, b"1")
    ch.basic_publish("", q, b"2")
    assert wait_until(conn, lambda: len(a) == 1, 2)
    settle(conn, 0.2)
    assert b == [] and _count(ch, q) == 1  # the inactive consumer gets nothing even with room
    # pika cancels the consumer (the next one takes over: 2), then closes the channel (1 is requeued)
    first.close()
    assert wait_until(conn, lambda: b == [b"2", b"1"], 2)


def test_x_single_active_consumer_must_be_bool(clients):
    _, ch = clients.channel()
    with channel_closed(406, "x-single-active-consumer"):
        ch.queue_declare(uid("q"), exclusive=True, arguments={"x-single-active-consumer": "yes"})


def test_consumer_argument_timeout_closes_channel_and_requeues(clients):
    conn, ch = clients.channel()
    q = ch.queue_declare(uid("q"), exclusive=True).method.queue
    ch.basic_publish("", q, b"slow")
    worker = conn.channel()
    closed = []
    worker._impl.add_on_close_callback(lambda _c, reason: closed.append(reason))
    got = []
    worker.basic_consume(q, lambda _c, m, p, b: got.append(b), arguments={"x-consumer-timeout": 300})
    start = time.monotonic()
    assert wait_until(conn, lambda: bool(closed), 3)
    assert time.monotonic() - start >= 0.3
    assert got == [b"slow"]
    assert closed[0].reply_code == 406
    assert "delivery acknowledgement on channel" in closed[0].reply_text and "300 ms" in closed[0].reply_text
    assert _count(ch, q) == 1
    m, _, body = ch.basic_get(q, auto_ack=True)
    assert body == b"slow" and m.redelivered


def test_acked_in_time_is_not_timed_out(clients):
    conn, ch = clients.channel()
    q = ch.queue_declare(uid("q"), exclusive=True, arguments={"x-consumer-timeout": 400}).method.queue
    got = []
    ch.basic_consume(q, lambda _c, m, p, b: (got.append(b), _c.basic_ack(m.delivery_tag)))
    for i in range(3):
        ch.basic_publish("", q, str(i).encode())
        settle(conn, 0.25)
    settle(conn, 0.5)
    assert ch.is_open and len(got) == 3


@lavinpy_only()
def test_consumer_timeout_setting_and_queue_argument(fresh_broker, fresh_clients, tmp_path):
    config = tmp_path / "lavinpy.yaml"
    config.write_text("consumer_timeout: 300\n")
    fresh_broker.stop()
    fresh_broker.extra_args = ["--config", str(config)]
    fresh_broker.start()
    conn, ch = fresh_clients.channel()
    q = ch.queue_declare(uid("q"), exclusive=True).method.queue
    ch.basic_publish("", q, b"x")
    getter = conn.channel()
    closed = []
    getter._impl.add_on_close_callback(lambda _c, reason: closed.append(reason))
    getter.basic_get(q)  # basic.get deliveries time out as well
    assert wait_until(conn, lambda: bool(closed), 3)
    assert closed[0].reply_code == 406 and "300 ms" in closed[0].reply_text
    # a queue argument beats the setting
    q2 = ch.queue_declare(uid("q"), exclusive=True, arguments={"x-consumer-timeout": 60000}).method.queue
    ch.basic_publish("", q2, b"y")
    holder = conn.channel()
    holder.basic_get(q2)
    settle(conn, 0.8)
    assert holder.is_open


def test_aio_pika_consumer_timeout(broker):
    async def main():
        conn = await aio_pika.connect(broker.url)
        async with conn:
            ch = await conn.channel()
            q = await ch.declare_queue(uid("q"), exclusive=True)
            await ch.default_exchange.publish(aio_pika.Message(b"m"), routing_key=q.name)
            worker = await conn.channel()
            wq = await worker.get_queue(q.name)
            got = []

            async def hold(message):  # never acks
                got.append(message)
            await wq.consume(hold, arguments={"x-consumer-timeout": 250})
            await asyncio.sleep(1.0)
            assert len(got) == 1 and worker.is_closed
            again = await q.get()
            assert again.body == b"m" and again.redelivered
            await again.ack()
    asyncio.run(asyncio.wait_for(main(), 30))


def test_aio_pika_single_active_consumer(broker):
    async def main():
        conn = await aio_pika.connect(broker.url)
        async with conn:
            ch = await conn.channel()
            q = await ch.declare_queue(uid("q"), exclusive=True, arguments={"x-single-active-consumer": True})
            got: dict[str, list[bytes]] = {"a": [], "b": []}

            def handler(name):
                async def on_message(m):
                    got[name].append(m.body)
                    await m.ack()
                return on_message
            tag_a = await q.consume(handler("a"))
            await q.consume(handler("b"))
            for i in range(3):
                await ch.default_exchange.publish(aio_pika.Message(str(i).encode()), routing_key=q.name)
            await asyncio.sleep(0.2)
            assert got == {"a": [b"0", b"1", b"2"], "b": []}
            await q.cancel(tag_a)
            await ch.default_exchange.publish(aio_pika.Message(b"3"), routing_key=q.name)
            await asyncio.sleep(0.2)
            assert got["b"] == [b"3"]
    asyncio.run(asyncio.wait_for(main(), 30))


def test_bad_consumer_timeout_argument_is_406(clients):
    conn, ch = clients.channel()
    q = ch.queue_declare(uid("q"), exclusive=True).method.queue
    with channel_closed(406, "x-consumer-timeout"):
        ch.basic_consume(q, lambda *a: None, arguments={"x-consumer-timeout": -1})
    ch = conn.channel()
    with channel_closed(406, "x-priority"):
        ch.basic_consume(q, lambda *a: None, arguments={"x-priority": "high"})
