"""The core areas again, through aio-pika's robust API (confirms are on by default there)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aio_pika
import aiormq
import pytest
from aio_pika import DeliveryMode, Message

from . import uid


def run(coro_fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro_fn(*args), 50))


async def connect(url: str) -> aio_pika.abc.AbstractRobustConnection:
    return await aio_pika.connect_robust(url, reconnect_interval=0.5, timeout=10)


async def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def _ignore(message: aio_pika.abc.AbstractIncomingMessage) -> None:
    pass


def test_publish_consume_ack(broker):
    async def main():
        conn = await connect(broker.url)
        async with conn:
            ch = await conn.channel()
            q = await ch.declare_queue(uid("q"), exclusive=True)
            for i in range(10):
                confirm = await ch.default_exchange.publish(Message(str(i).encode(), message_id=str(i)),
                                                            routing_key=q.name)
                assert isinstance(confirm, aiormq.spec.Basic.Ack)
            got = []
            async with q.iterator() as it:
                async for message in it:
                    async with message.process():
                        got.append((message.body, message.message_id, message.redelivered))
                    if len(got) == 10:
                        break
            assert got == [(str(i).encode(), str(i), False) for i in range(10)]
            q2 = await ch.declare_queue(q.name, passive=True)
            assert q2.declaration_result.message_count == 0
    run(main)


def test_get_nack_and_reject(broker):
    async def main():
        conn = await connect(broker.url)
        async with conn:
            ch = await conn.channel()
            q = await ch.declare_queue(uid("q"), exclusive=True)
            for body in (b"a", b"b", b"c"):
                await ch.default_exchange.publish(Message(body), routing_key=q.name)
            m = await q.get(no_ack=False)
            assert m.body == b"a"
            await m.nack(requeue=True)
            m = await q.get(no_ack=False)
            assert (m.body, m.redelivered) == (b"a", True)
            await m.reject(requeue=False)
            m = await q.get(no_ack=False)
            assert m.body == b"b"
            await m.ack()
            m = await q.get(no_ack=True)
            assert m.body == b"c"
            assert await q.get(fail=False) is None
    run(main)


def test_mandatory_return(broker):
    async def main():
        conn = await connect(broker.url)
        async with conn:
            ch = await conn.channel(on_return_raises=True)
            amq_direct = await ch.get_exchange("amq.direct")
            with pytest.raises(aio_pika.exceptions.PublishError) as e:
                await amq_direct.publish(Message(b"x"), routing_key=uid("nowhere"))
            assert e.value.frame.reply_code == 312
            # mandatory=False: silently dropped, still confirmed
            ack = await amq_direct.publish(Message(b"y"), routing_key=uid("nowhere"), mandatory=False)
            assert isinstance(ack, aiormq.spec.Basic.Ack)
            # on_return_raises=False: the return callback sees it
            ch2 = await conn.channel()
            returned = []
            ch2.return_callbacks.add(lambda _ch, msg: returned.append(msg.body))
            x2 = await ch2.get_exchange("amq.direct")
            await x2.publish(Message(b"z"), routing_key=uid("nowhere"))
            await until(lambda: bool(returned))
            assert returned == [b"z"]
    run(main)


def test_exclusive_and_auto_delete(broker):
    async def main():
        owner = await connect(broker.url)
        other = await connect(broker.url)
        async with owner, other:
            och = await owner.channel()
            q = await och.declare_queue(uid("excl"), exclusive=True)
            xch = await other.channel()
            with pytest.raises(aiormq.exceptions.ChannelLockedResource):
                await xch.declare_queue(q.name, exclusive=True)
            ad = await och.declare_queue(uid("ad"), auto_delete=True)
            tag = await ad.consume(_ignore)
            await ad.cancel(tag)
            ch3 = await other.channel()
            with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
                await ch3.declare_queue(ad.name, passive=True)
        # the exclusive queue went with its connection
        conn = await connect(broker.url)
        async with conn:
            ch = await conn.channel()
            with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
                await ch.declare_queue(q.name, passive=True)
    run(main)


def test_qos_prefetch(broker):
    async def main():
        conn = await connect(broker.url)
        async with conn:
            ch = await conn.channel()
            q = await ch.declare_queue(uid("q"), exclusive=True)
            for i in range(10):
                await ch.default_exchange.publish(Message(str(i).encode()), routing_key=q.name)
            cch = await conn.channel()
            await cch.set_qos(prefetch_count=3)
            cq = await cch.get_queue(q.name)
            got: list[aio_pika.abc.AbstractIncomingMessage] = []

            async def collect(m: aio_pika.abc.AbstractIncomingMessage) -> None:
                got.append(m)
            await cq.consume(collect)
            await until(lambda: len(got) >= 3)
            await asyncio.sleep(0.3)
            assert len(got) == 3
            await got[0].ack()
            await until(lambda: len(got) >= 4)
            await asyncio.sleep(0.2)
            assert len(got) == 4
            acked = 1
            for _ in range(200):
                while acked < len(got):
                    await got[acked].ack()
                    acked += 1
                if len(got) == 10:
                    break
                await asyncio.sleep(0.02)
            assert [m.body for m in got][:4] == [b"0", b"1", b"2", b"3"]
            assert len(got) == 10
    run(main)


def test_topic_and_fanout_exchanges(broker):
    async def main():
        conn = await connect(broker.url)
        async with conn:
            ch = await conn.channel()
            topic = await ch.declare_exchange(uid("t"), aio_pika.ExchangeType.TOPIC, auto_delete=True)
            q1 = await ch.declare_queue(uid("q"), exclusive=True)
            q2 = await ch.declare_queue(uid("q"), exclusive=True)
            await q1.bind(topic, "a.*")
            await q2.bind(topic, "#.z")
            await topic.publish(Message(b"1"), "a.b")
            await topic.publish(Message(b"2"), "a.z")
            await topic.publish(Message(b"3"), "x.y.z")
            with pytest.raises(aio_pika.exceptions.PublishError):
                ch_r = await conn.channel(on_return_raises=True)
                t2 = await ch_r.get_exchange(topic.name)
                await t2.publish(Message(b"4"), "q.q")

            async def drain(q):
                out = []
                while (m := await q.get(no_ack=True, fail=False)) is not None:
                    out.append(m.body)
                return out
            assert await drain(q1) == [b"1", b"2"]
            assert await drain(q2) == [b"2", b"3"]
    run(main)


def test_rpc_with_direct_reply_to(broker):
    async def main():
        conn = await connect(broker.url)
        async with conn:
            sch = await conn.channel()
            rpc_q = await sch.declare_queue(uid("rpc"), exclusive=True)

            async def serve(m: aio_pika.abc.AbstractIncomingMessage) -> None:
                async with m.process():
                    await sch.default_exchange.publish(
                        Message(b"pong:" + m.body, correlation_id=m.correlation_id), routing_key=m.reply_to)
            await rpc_q.consume(serve)
            cch = await conn.channel()
            reply_q = await cch.get_queue("amq.rabbitmq.reply-to", ensure=False)
            replies: asyncio.Queue = asyncio.Queue()
            await reply_q.consume(replies.put, no_ack=True)
            await cch.default_exchange.publish(
                Message(b"ping", correlation_id="c1", reply_to="amq.rabbitmq.reply-to"), routing_key=rpc_q.name)
            reply = await asyncio.wait_for(replies.get(), 10)
            assert (reply.body, reply.correlation_id) == (b"pong:ping", "c1")
    run(main)


def test_restart_durability_and_reconnect(fresh_broker):
    b = fresh_broker

    async def main():
        conn = await connect(b.url)
        reconnected = asyncio.Event()
        conn.reconnect_callbacks.add(lambda *a: reconnected.set())
        async with conn:
            ch = await conn.channel()
            qname = uid("durable")
            q = await ch.declare_queue(qname, durable=True)
            for i in range(20):
                await ch.default_exchange.publish(
                    Message(str(i).encode(), delivery_mode=DeliveryMode.PERSISTENT), routing_key=qname)
            await ch.default_exchange.publish(
                Message(b"transient", delivery_mode=DeliveryMode.NOT_PERSISTENT), routing_key=qname)
            await asyncio.get_running_loop().run_in_executor(None, b.restart)
            await asyncio.wait_for(reconnected.wait(), 30)
            # the robust channel and queue objects work again after the reconnect
            await ch.default_exchange.publish(
                Message(b"after", delivery_mode=DeliveryMode.PERSISTENT), routing_key=qname)
            bodies = []
            while (m := await q.get(no_ack=True, fail=False)) is not None:
                bodies.append(m.body)
            assert bodies == [str(i).encode() for i in range(20)] + [b"after"]
            await q.delete()
    run(main)


def test_robust_consumer_resumes_after_restart(fresh_broker):
    b = fresh_broker

    async def main():
        conn = await connect(b.url)
        reconnected = asyncio.Event()
        conn.reconnect_callbacks.add(lambda *a: reconnected.set())
        async with conn:
            ch = await conn.channel()
            qname = uid("durable")
            q = await ch.declare_queue(qname, durable=True)
            got: asyncio.Queue = asyncio.Queue()

            async def on_message(m: aio_pika.abc.AbstractIncomingMessage) -> None:
                async with m.process():
                    await got.put(m.body)
            await q.consume(on_message)
            await ch.default_exchange.publish(Message(b"before", delivery_mode=2), routing_key=qname)
            assert await asyncio.wait_for(got.get(), 10) == b"before"
            await asyncio.get_running_loop().run_in_executor(None, b.restart)
            await asyncio.wait_for(reconnected.wait(), 30)
            await ch.default_exchange.publish(Message(b"after", delivery_mode=2), routing_key=qname)
            assert await asyncio.wait_for(got.get(), 10) == b"after"
            await q.delete(if_unused=False)
    run(main)
