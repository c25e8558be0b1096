"""Acknowledgements: ack/nack/reject (multiple, requeue), recover, get, requeue on channel/connection close."""

from __future__ import annotations

import pika

from . import bodies, channel_closed, get_all, settle, uid, wait_until


def _setup(clients, n=10, confirm=True):
    conn, ch = clients.channel()
    if confirm:
        ch.confirm_delivery()
    q = ch.queue_declare(uid("q"), exclusive=True).method.queue
    for i in range(n):
        ch.basic_publish("", q, str(i).encode())
    return conn, ch, q


def _count(ch, q):
    ok = ch.queue_declare(q, passive=True).method
    return ok.message_count


def test_basic_get_and_get_empty(clients):
    conn, ch, q = _setup(clients, 3)
    m, props, body = ch.basic_get(q, auto_ack=True)
    assert body == b"0" and m.message_count == 2 and m.redelivered is False
    assert (m.exchange, m.routing_key) == ("", q)
    m, _, body = ch.basic_get(q, auto_ack=True)
    assert body == b"1" and m.message_count == 1
    m, _, body = ch.basic_get(q, auto_ack=True)
    assert body == b"2" and m.message_count == 0
    assert ch.basic_get(q, auto_ack=True) == (None, None, None)


def test_get_from_missing_queue_is_404(clients):
    _, ch = clients.channel()
    with channel_closed(404):
        ch.basic_get(uid("missing"))


def test_ack_single_and_multiple(clients):
    conn, ch, q = _setup(clients, 6)
    msgs = get_all(ch, q, auto_ack=False)
    tags = [m.delivery_tag for m, _, _ in msgs]
    assert tags == [1, 2, 3, 4, 5, 6]
    ch.basic_ack(2)
    ch.basic_ack(4, multiple=True)  # 1, 3, 4
    ch.close()  # 5 and 6 go back
    ch = conn.channel()
    back = get_all(ch, q)
    assert bodies(back) == [b"4", b"5"]
    assert all(m.redelivered for m, _, _ in back)


def test_ack_zero_multiple_acks_everything(clients):
    conn, ch, q = _setup(clients, 5)
    get_all(ch, q, auto_ack=False)
    ch.basic_ack(0, multiple=True)
    ch.close()
    ch = conn.channel()
    assert get_all(ch, q) == []


def test_nack_multiple_requeue_keeps_order(clients):
    conn, ch, q = _setup(clients, 6)
    msgs = get_all(ch, q, auto_ack=False, limit=4)  # 0..3 unacked, 4, 5 ready
    assert bodies(msgs) == [b"0", b"1", b"2", b"3"]
    ch.basic_nack(msgs[3][0].delivery_tag, multiple=True, requeue=True)
    back = get_all(ch, q, auto_ack=True)
    assert bodies(back) == [b"0", b"1", b"2", b"3", b"4", b"5"]
    assert [m.redelivered for m, _, _ in back] == [True] * 4 + [False] * 2


def test_nack_and_reject_without_requeue_drop(clients):
    conn, ch, q = _setup(clients, 5)
    msgs = get_all(ch, q, auto_ack=False)
    ch.basic_reject(msgs[0][0].delivery_tag, requeue=False)
    ch.basic_nack(msgs[2][0].delivery_tag, multiple=True, requeue=False)  # 1, 2
    ch.basic_nack(msgs[3][0].delivery_tag, multiple=False, requeue=True)
    ch.basic_reject(msgs[4][0].delivery_tag, requeue=True)
    back = get_all(ch, q, auto_ack=True)
    assert bodies(back) == [b"3", b"4"]
    assert all(m.redelivered for m, _, _ in back)


def test_reject_requeue_goes_back_to_head(clients):
    conn, ch, q = _setup(clients, 3)
    m, _, body = ch.basic_get(q, auto_ack=False)
    assert body == b"0"
    ch.basic_reject(m.delivery_tag, requeue=True)
    back = get_all(ch, q)
    assert bodies(back) == [b"0", b"1", b"2"]
    assert [m.redelivered for m, _, _ in back] == [True, False, False]


def test_unknown_delivery_tag_is_406(clients):
    conn, ch, q = _setup(clients, 1)
    with channel_closed(406) as c:
        ch.basic_ack(99)
        ch.basic_qos(prefetch_count=0)
    assert c.reply_text == "PRECONDITION_FAILED - unknown delivery tag 99"


def test_double_ack_is_406(clients):
    conn, ch, q = _setup(clients, 1)
    m, _, _ = ch.basic_get(q, auto_ack=False)
    ch.basic_ack(m.delivery_tag)
    with channel_closed(406, "unknown delivery tag 1"):
        ch.basic_ack(m.delivery_tag)
        ch.basic_qos(prefetch_count=0)


def test_ack_of_no_ack_delivery_is_406(clients):
    conn, ch, q = _setup(clients, 1)
    m, _, _ = ch.basic_get(q, auto_ack=True)
    with channel_closed(406, "unknown delivery tag 1"):
        ch.basic_ack(m.delivery_tag)
        ch.basic_qos(prefetch_count=0)


def test_unacked_of_closed_channel_go_back_in_order(clients):
    conn, ch, q = _setup(clients, 10)
    c = conn.channel()
    c.basic_qos(prefetch_count=5)
    got = []
    c.basic_consume(q, lambda _c, m, p, b: got.append(b))
    assert wait_until(conn, lambda: len(got) == 5)
    c.close()
    back = get_all(ch, q)
    assert bodies(back) == [str(i).encode() for i in range(10)]
    assert [m.redelivered for m, _, _ in back] == [True] * 5 + [False] * 5


def test_unacked_of_closed_connection_go_back_in_order(clients):
    conn, ch = clients.channel()
    ch.confirm_delivery()
    pub = clients.track_queue(uid("q"))
    ch.queue_declare(pub)
    for i in range(8):
        ch.basic_publish("", pub, str(i).encode(), pika.BasicProperties(message_id=str(i)))
    other_conn, other = clients.channel()
    other.basic_qos(prefetch_count=3)
    got = []
    other.basic_consume(pub, lambda _c, m, p, b: got.append(b))
    assert wait_until(other_conn, lambda: len(got) == 3)
    other_conn.close()
    settle(conn, 0.2)
    back = get_all(ch, pub)
    assert bodies(back) == [str(i).encode() for i in range(8)]
    assert [m.redelivered for m, _, _ in back] == [True] * 3 + [False] * 5
    assert [p.message_id for _, p, _ in back] == [str(i) for i in range(8)]


def test_acked_messages_do_not_come_back(clients):
    conn, ch, q = _setup(clients, 4)
    c = conn.channel()
    got = []

    def cb(_c, m, p, b):
        got.append(b)
        if b in (b"0", b"2"):
            _c.basic_ack(m.delivery_tag)
    c.basic_consume(q, cb)
    assert wait_until(conn, lambda: len(got) == 4)
    c.close()
    assert bodies(get_all(ch, q)) == [b"1", b"3"]


def test_recover_requeue_redelivers(clients):
    conn, ch, q = _setup(clients, 3)
    c = conn.channel()
    got = []
    c.basic_consume(q, lambda _c, m, p, b: got.append((m, b)))
    assert wait_until(conn, lambda: len(got) == 3)
    assert not any(m.redelivered for m, _ in got)
    c.basic_recover(requeue=True)
    assert wait_until(conn, lambda: len(got) == 6)
    again = got[3:]
    assert [b for _, b in again] == [b"0", b"1", b"2"]
    assert all(m.redelivered for m, _ in again)
    assert [m.delivery_tag for m, _ in again] == [4, 5, 6]
    c.basic_ack(6, multiple=True)
    c.close()
    assert get_all(ch, q) == []


def test_delivery_tags_shared_by_get_and_consume(clients):
    conn, ch, q = _setup(clients, 4)
    m1, _, _ = ch.basic_get(q, auto_ack=False)
    got = []
    ch.basic_consume(q, lambda _c, m, p, b: got.append(m.delivery_tag))
    assert wait_until(conn, lambda: len(got) == 3)
    assert [m1.delivery_tag, *got] == [1, 2, 3, 4]
