"""A queue delivers ready messages to its consumer a run at a time, and a basic.ack multiple=true
settles a run at once: both prefetch windows, the redelivered flags, order and tags stay exact."""

from __future__ import annotations

import pika

from . import settle, uid, wait_until
from .rawamqp import RawAMQP, commands
from .test_publish_runs import PERSISTENT, confirmed_upto, run_bytes


def _fill(ch, n: int, durable: bool = True) -> str:
    q = ch.queue_declare(uid("runs"), durable=durable).method.queue
    ch.confirm_delivery()
    props = pika.BasicProperties(delivery_mode=2 if durable else 1)
    for i in range(n):
        ch.basic_publish("", q, str(i).encode(), props)
    return q


def _collector(ch, q: str, **kwargs):
    got: list = []
    ch.basic_consume(q, lambda _c, m, _p, b: got.append((m, b)), **kwargs)
    return got


def test_consumer_prefetch_caps_each_run_and_multiple_ack_opens_it_again(clients) -> None:
    conn, ch = clients.channel()
    q = _fill(ch, 1000)
    ch.basic_qos(prefetch_count=300)
    got = _collector(ch, q)
    assert wait_until(conn, lambda: len(got) >= 300)
    settle(conn, 0.4)
    assert len(got) == 300  # never more than the prefetch
    ch.basic_ack(got[149][0].delivery_tag, multiple=True)  # settles 150 at once
    assert wait_until(conn, lambda: len(got) >= 450)
    settle(conn, 0.4)
    assert len(got) == 450
    assert [m.delivery_tag for m, _ in got] == list(range(1, 451))
    assert [b for _, b in got] == [str(i).encode() for i in range(450)]
    assert not any(m.redelivered for m, _ in got)
    ch.basic_ack(0, multiple=True)  # everything delivered so far
    assert wait_until(conn, lambda: len(got) >= 750)
    ch.basic_ack(0, multiple=True)
    assert wait_until(conn, lambda: len(got) >= 1000)
    ch.basic_ack(0, multiple=True)
    settle(conn, 0.3)
    assert [b for _, b in got] == [str(i).encode() for i in range(1000)]
    assert ch.queue_declare(q, passive=True).method.message_count == 0
    ch.queue_delete(q)


def test_channel_wide_prefetch_caps_a_run(clients) -> None:
    conn, ch = clients.channel()
    q = _fill(ch, 200)
    ch.basic_qos(prefetch_count=70, global_qos=True)
    got = _collector(ch, q)
    assert wait_until(conn, lambda: len(got) >= 70)
    settle(conn, 0.4)
    assert len(got) == 70
    ch.basic_ack(got[-1][0].delivery_tag, multiple=True)
    assert wait_until(conn, lambda: len(got) >= 140)
    settle(conn, 0.4)
    assert len(got) == 140
    assert [b for _, b in got] == [str(i).encode() for i in range(140)]
    ch.queue_delete(q)


def test_channel_wide_prefetch_caps_several_consumers_of_one_queue(clients) -> None:
    """The queue's rounds over several consumers hand out a run per consumer at once: a channel-wide
    prefetch shared by them still bounds the total."""
    conn, ch = clients.channel()
    q = ch.queue_declare(uid("runs"), durable=True).method.queue
    ch.basic_qos(prefetch_count=10, global_qos=True)
    got: list = []
    for _ in range(3):
        ch.basic_consume(q, lambda _c, m, _p, b: got.append((m, b)))
    _, publisher = clients.channel()
    publisher.confirm_delivery()
    for i in range(200):
        publisher.basic_publish("", q, str(i).encode(), pika.BasicProperties(delivery_mode=2))
    assert wait_until(conn, lambda: len(got) >= 10)
    settle(conn, 0.4)
    assert len(got) == 10
    ch.basic_ack(0, multiple=True)
    assert wait_until(conn, lambda: len(got) >= 20)
    settle(conn, 0.4)
    assert len(got) == 20
    assert sorted(int(b) for _, b in got) == list(range(20))
    ch.queue_delete(q)


def test_requeued_messages_come_first_in_a_run_marked_redelivered(clients) -> None:
    conn, ch = clients.channel()
    q = _fill(ch, 40)
    ch.basic_qos(prefetch_count=10)
    got = _collector(ch, q)
    assert wait_until(conn, lambda: len(got) >= 10)
    settle(conn, 0.2)
    ch.basic_nack(got[9][0].delivery_tag, multiple=True, requeue=True)
    for upto in (20, 30, 40, 50):  # the prefetch stays 10: ack each window to get the next
        assert wait_until(conn, lambda upto=upto: len(got) >= upto)
        settle(conn, 0.1)
        assert len(got) == upto
        ch.basic_ack(got[-1][0].delivery_tag, multiple=True)
    again = got[10:]
    assert [b for _, b in again] == [str(i).encode() for i in range(40)]
    assert [m.redelivered for m, _ in again] == [True] * 10 + [False] * 30
    assert [m.delivery_tag for m, _ in again] == list(range(11, 51))
    ch.queue_delete(q)


def test_multiple_ack_across_two_queues_on_one_channel(clients) -> None:
    conn, ch = clients.channel()
    q1 = _fill(ch, 30)
    q2 = ch.queue_declare(uid("runs"), durable=True).method.queue
    for i in range(30):
        ch.basic_publish("", q2, str(i).encode(), pika.BasicProperties(delivery_mode=2))
    ch.basic_qos(prefetch_count=20)
    got1 = _collector(ch, q1)
    got2 = _collector(ch, q2)
    assert wait_until(conn, lambda: len(got1) >= 20 and len(got2) >= 20)
    last = max(m.delivery_tag for m, _ in got1 + got2)
    ch.basic_ack(last, multiple=True)  # interleaved deliveries of both queues, settled at once
    assert wait_until(conn, lambda: len(got1) >= 30 and len(got2) >= 30)
    ch.basic_ack(0, multiple=True)
    settle(conn, 0.3)
    assert [b for _, b in got1] == [str(i).encode() for i in range(30)]
    assert [b for _, b in got2] == [str(i).encode() for i in range(30)]
    for q in (q1, q2):
        ok = ch.queue_declare(q, passive=True).method
        assert (ok.message_count, ok.consumer_count) == (0, 1)
    ch.close()
    _, ch2 = clients.channel()
    for q in (q1, q2):  # nothing was left unacked to come back
        assert ch2.queue_declare(q, passive=True).method.message_count == 0
        ch2.queue_delete(q)


def test_autoack_runs_remove_messages_in_order(clients) -> None:
    conn, ch = clients.channel()
    q = _fill(ch, 2000)
    got = _collector(ch, q, auto_ack=True)
    assert wait_until(conn, lambda: len(got) >= 2000)
    assert [b for _, b in got] == [str(i).encode() for i in range(2000)]
    assert ch.queue_declare(q, passive=True).method.message_count == 0
    ch.queue_delete(q)


def test_a_published_run_goes_to_a_waiting_consumer_up_to_its_prefetch(broker, clients) -> None:
    # One write of 300 publishes reaches the queue as a run; its head goes straight to the waiting
    # consumer (prefetch 40), the rest waits in the queue for acks.
    conn, ch = clients.channel()
    q = ch.queue_declare(uid("runs"), durable=True).method.queue
    ch.basic_qos(prefetch_count=40)
    got = _collector(ch, q)
    settle(conn, 0.2)
    bodies = [f"m{i}".encode() for i in range(300)]
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        c.call(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
        c.send_raw(run_bytes(1, "", q, bodies, PERSISTENT))
        confirmed_upto(c, len(bodies))
    assert wait_until(conn, lambda: len(got) >= 40)
    settle(conn, 0.3)
    assert len(got) == 40
    assert ch.queue_declare(q, passive=True).method.message_count == 260
    while len(got) < 300:
        ch.basic_ack(got[-1][0].delivery_tag, multiple=True)
        upto = len(got) + 40
        assert wait_until(conn, lambda upto=upto: len(got) >= min(upto, 300))
    ch.basic_ack(0, multiple=True)
    assert [b for _, b in got] == bodies
    assert [m.delivery_tag for m, _ in got] == list(range(1, 301))
    ch.queue_delete(q)
