"""Length limits (x-max-length, x-max-length-bytes, x-overflow) and the maximum message size."""

from __future__ import annotations

import asyncio

import aio_pika
import aiormq
import pika
import pytest

from . import bodies, channel_closed, get_all, settle, uid, wait_until


def _count(ch, q: str) -> int:
    return ch.queue_declare(q, passive=True).method.message_count


def test_drop_head_dead_letters_the_oldest(clients):
    conn, ch = clients.channel()
    dlq = ch.queue_declare(uid("dlq"), exclusive=True).method.queue
    q = ch.queue_declare(uid("q"), exclusive=True, arguments={
        "x-max-length": 3, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}).method.queue
    ch.confirm_delivery()
    for i in range(5):
        ch.basic_publish("", q, str(i).encode())
    assert bodies(get_all(ch, q)) == [b"2", b"3", b"4"]
    got = get_all(ch, dlq)
    assert bodies(got) == [b"0", b"1"]
    assert got[0][1].headers["x-death"][0]["reason"] == "maxlen"


def test_max_length_counts_ready_messages_only(clients):
    conn, ch = clients.channel()
    q = ch.queue_declare(uid("q"), exclusive=True, arguments={"x-max-length": 1}).method.queue
    ch.confirm_delivery()
    ch.basic_publish("", q, b"a")
    m, _, _ = ch.basic_get(q)  # unacked: no longer counts
    ch.basic_publish("", q, b"b")
    ch.basic_publish("", q, b"c")  # drops b
    ch.basic_nack(m.delivery_tag, requeue=True)  # a is back: the queue is over its limit only until the next publish
    assert bodies(get_all(ch, q)) == [b"a", b"c"]


def test_max_length_bytes_drop_head(clients):
    _, ch = clients.channel()
    q = ch.queue_declare(uid("q"), exclusive=True, arguments={"x-max-length-bytes": 10}).method.queue
    ch.confirm_delivery()
    for body in (b"aaaa", b"bbbb", b"cccc", b"dd"):
        ch.basic_publish("", q, body)
    assert bodies(get_all(ch, q)) == [b"bbbb", b"cccc", b"dd"]
    ch.basic_publish("", q, b"x" * 11)  # larger than the limit on its own: nothing stays
    assert _count(ch, q) == 0


def test_reject_publish_nacks_and_stores_nothing(clients):
    conn, ch = clients.channel()
    q = ch.queue_declare(uid("q"), exclusive=True, arguments={"x-max-length": 2,
                                                              "x-overflow": "reject-publish"}).method.queue
    ch.confirm_delivery()
    ch.basic_publish("", q, b"1")
    ch.basic_publish("", q, b"2")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", q, b"3")
    assert _count(ch, q) == 2
    ch.basic_get(q, auto_ack=True)
    ch.basic_publish("", q, b"4")  # room again: acked
    assert bodies(get_all(ch, q)) == [b"2", b"4"]


def test_reject_publish_dlx_dead_letters_the_refused_message(clients):
    conn, ch = clients.channel()
    dlq = ch.queue_declare(uid("dlq"), exclusive=True).method.queue
    q = ch.queue_declare(uid("q"), exclusive=True, arguments={
        "x-max-length-bytes": 3, "x-overflow": "reject-publish-dlx",
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}).method.queue
    ch.confirm_delivery()
    ch.basic_publish("", q, b"abc")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", q, b"d")
    assert bodies(get_all(ch, q)) == [b"abc"]
    [(_, props, body)] = get_all(ch, dlq)
    assert body == b"d" and props.headers["x-death"][0]["reason"] == "maxlen"


def test_confirms_mix_acks_and_nacks_in_order(clients):
    """Pipelined publishes: each refused one gets its own nack, the rest are acked."""
    conn = clients.connect()
    ch = conn.channel()
    q = ch.queue_declare(uid("q"), exclusive=True, arguments={"x-max-length": 3,
                                                              "x-overflow": "reject-publish"}).method.queue
    impl = ch._impl  # the asynchronous channel: publish without waiting for each confirm
    acked, nacked = [], []

    def on_confirm(frame):
        kind = acked if isinstance(frame.method, pika.spec.Basic.Ack) else nacked
        kind.append((frame.method.delivery_tag, frame.method.multiple))
    impl.confirm_delivery(on_confirm)
    conn.process_data_events(time_limit=0.2)
    for i in range(5):
        impl.basic_publish("", q, str(i).encode())
    assert wait_until(conn, lambda: sum(t for t, _ in acked[-1:]) >= 3 and len(nacked) == 2, 3)
    assert nacked == [(4, False), (5, False)]
    assert max(t for t, _ in acked) == 3


def test_limit_arguments_are_validated(clients):
    for args, name in (({"x-max-length": -1}, "x-max-length"), ({"x-max-length-bytes": "1"}, "x-max-length-bytes"),
                       ({"x-overflow": "drop-tail"}, "x-overflow")):
        _, ch = clients.channel()
        with channel_closed(406) as c:
            ch.queue_declare(uid("q"), exclusive=True, arguments=args)
        assert f"'{name}'" in c.reply_text


def test_message_above_max_size_closes_the_channel(clients):
    """max size: the announced body size is checked before any body frame arrives (default 128 MiB)."""
    conn, ch = clients.channel()
    q = ch.queue_declare(uid("q"), exclusive=True).method.queue
    impl = ch._impl
    closed = []
    impl.add_on_close_callback(lambda _ch, reason: closed.append(reason))
    # basic.publish and a header announcing 128 MiB + 1 bytes, then no body: the broker must not wait for it.
    conn._impl._send_frame(pika.frame.Method(impl.channel_number,
                                             pika.spec.Basic.Publish(exchange="", routing_key=q)))
    conn._impl._send_frame(pika.frame.Header(impl.channel_number, 128 * 1024 * 1024 + 1, pika.BasicProperties()))
    assert wait_until(conn, lambda: bool(closed), 3)
    assert closed[0].reply_code == 406
    assert "134217729" in closed[0].reply_text and "134217728" in closed[0].reply_text
    assert _count(conn.channel(), q) == 0


def test_aio_pika_reject_publish_returns_nack(broker):
    async def main():
        conn = await aio_pika.connect_robust(broker.url)
        async with conn:
            ch = await conn.channel()
            q = await ch.declare_queue(uid("q"), exclusive=True, arguments={
                "x-max-length": 1, "x-overflow": "reject-publish"})
            ok = await ch.default_exchange.publish(aio_pika.Message(b"1"), routing_key=q.name)
            assert isinstance(ok, aiormq.spec.Basic.Ack)
            try:
                result = await ch.default_exchange.publish(aio_pika.Message(b"2"), routing_key=q.name)
            except aio_pika.exceptions.DeliveryError as e:
                result = e.frame
            assert isinstance(result, aiormq.spec.Basic.Nack)
            assert q.declaration_result.message_count == 0
            await q.declare()
            assert q.declaration_result.message_count == 1
    asyncio.run(asyncio.wait_for(main(), 30))


def test_drop_head_with_a_consumer_waiting_delivers_directly(clients):
    conn, ch = clients.channel()
    q = ch.queue_declare(uid("q"), exclusive=True, arguments={"x-max-length": 0}).method.queue
    got = []
    ch.basic_consume(q, lambda c, m, p, b: got.append(b), auto_ack=True)
    ch.basic_publish("", q, b"direct")
    assert wait_until(conn, lambda: got == [b"direct"], 2)
    settle(conn, 0.05)
