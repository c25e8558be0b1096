"""Queues: declare (server-named, passive, durable, exclusive, auto-delete), bind, purge, delete."""

from __future__ import annotations

import pika
import pytest

from . import bodies, channel_closed, get_all, settle, uid, wait_until


def test_server_named_queue(clients):
    _, ch = clients.channel()
    names = {ch.queue_declare("", exclusive=True).method.queue for _ in range(3)}
    assert len(names) == 3
    for name in names:
        assert name.startswith("amq.gen-") and len(name) > len("amq.gen-") + 8
    name = names.pop()
    ch.basic_publish("", name, b"x")
    assert bodies(get_all(ch, name)) == [b"x"]


def test_declare_ok_counts(clients):
    conn, ch = clients.channel()
    ch.confirm_delivery()  # publishes wait for their confirm: the counts below are exact
    q = ch.queue_declare(uid("q"), exclusive=True).method.queue
    ok = ch.queue_declare(q, exclusive=True).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == (q, 0, 0)
    for i in range(5):
        ch.basic_publish("", q, str(i).encode())
    ok = ch.queue_declare(q, passive=True).method
    assert (ok.message_count, ok.consumer_count) == (5, 0)
    # one consumer, prefetch 2: 2 unacked, 3 ready; declare-ok counts only ready messages
    ch2 = conn.channel()
    ch2.basic_qos(prefetch_count=2)
    got = []
    ch2.basic_consume(q, lambda c, m, p, b: got.append(m))
    assert wait_until(conn, lambda: len(got) == 2)
    ok = ch.queue_declare(q, passive=True).method
    assert (ok.message_count, ok.consumer_count) == (3, 1)


def test_passive_declare_of_missing_queue_is_404(clients):
    _, ch = clients.channel()
    name = uid("q")
    with channel_closed(404) as c:
        ch.queue_declare(name, passive=True)
    assert c.reply_text.startswith("NOT_FOUND") and f"'{name}'" in c.reply_text


def test_reserved_amq_queue_name_is_403(clients):
    _, ch = clients.channel()
    with channel_closed(403) as c:
        ch.queue_declare("amq." + uid("q"))
    assert c.reply_text.startswith("ACCESS_REFUSED")


def test_redeclare_with_other_properties_is_406(clients):
    conn, ch = clients.channel()
    q = clients.track_queue(uid("q"))
    ch.queue_declare(q, durable=False, arguments={"x-max-length": 10})
    ch.queue_declare(q, durable=False, arguments={"x-max-length": 10})  # equivalent: fine
    for kwargs in ({"durable": True, "arguments": {"x-max-length": 10}},
                   {"auto_delete": True, "arguments": {"x-max-length": 10}},
                   {"arguments": {"x-max-length": 11}},
                   {"arguments": {}}):
        with channel_closed(406) as c:
            ch.queue_declare(q, **kwargs)
        assert c.reply_text.startswith("PRECONDITION_FAILED") and q in c.reply_text, kwargs
        ch = conn.channel()
    assert ch.queue_declare(q, passive=True).method.queue == q


def test_exclusive_queue_locked_to_its_connection(clients):
    owner_conn, owner = clients.channel()
    q = owner.queue_declare(uid("q"), exclusive=True).method.queue
    other_conn, other = clients.channel()
    with channel_closed(405) as c:
        other.queue_declare(q, exclusive=True)
    assert c.reply_text.startswith("RESOURCE_LOCKED") and q in c.reply_text
    for action in (lambda ch: ch.queue_declare(q, passive=True),
                   lambda ch: ch.queue_declare(q),
                   lambda ch: ch.basic_consume(q, lambda *a: None),
                   lambda ch: ch.basic_get(q),
                   lambda ch: ch.queue_purge(q),
                   lambda ch: ch.queue_delete(q)):
        other = other_conn.channel()
        with channel_closed(405):
            action(other)
    # others may publish to it
    other = other_conn.channel()
    other.basic_publish("", q, b"from-other")
    assert wait_until(owner_conn, lambda: owner.queue_declare(q, passive=True).method.message_count == 1)
    assert bodies(get_all(owner, q)) == [b"from-other"]


def test_exclusive_queue_dies_with_its_connection(clients):
    owner_conn, owner = clients.channel()
    q = owner.queue_declare(uid("q"), exclusive=True).method.queue
    owner.basic_publish("", q, b"x")
    owner_conn.close()
    _, ch = clients.channel()
    with channel_closed(404):
        ch.queue_declare(q, passive=True)


def test_exclusive_queue_survives_its_channel(clients):
    conn, ch = clients.channel()
    q = ch.queue_declare(uid("q"), exclusive=True).method.queue
    ch.close()
    ch = conn.channel()
    assert ch.queue_declare(q, passive=True).method.queue == q


def test_auto_delete_queue_dies_with_last_consumer(clients):
    conn, ch = clients.channel()
    q = clients.track_queue(uid("q"))
    ch.queue_declare(q, auto_delete=True)
    settle(conn, 0.2)
    ch.queue_declare(q, passive=True)  # never had a consumer: stays
    t1 = ch.basic_consume(q, lambda *a: None)
    t2 = ch.basic_consume(q, lambda *a: None)
    ch.basic_cancel(t1)
    assert ch.queue_declare(q, passive=True).method.consumer_count == 1
    ch.basic_cancel(t2)
    with channel_closed(404):
        ch.queue_declare(q, passive=True)


def test_auto_delete_queue_dies_when_consumer_channel_closes(clients):
    conn, ch = clients.channel()
    q = clients.track_queue(uid("q"))
    ch.queue_declare(q, auto_delete=True)
    ch2 = conn.channel()
    ch2.basic_consume(q, lambda *a: None)
    ch2.close()
    settle(conn, 0.2)
    with channel_closed(404):
        ch.queue_declare(q, passive=True)


def test_bind_and_unbind(clients):
    conn, ch = clients.channel()
    q = ch.queue_declare(uid("q"), exclusive=True).method.queue
    ex = clients.track_exchange(uid("x"))
    ch.exchange_declare(ex, "direct")
    ch.queue_bind(q, ex, "a")
    ch.queue_bind(q, ex, "a")  # binding twice is one binding
    ch.queue_bind(q, ex, "b")
    ch.basic_publish(ex, "a", b"1")
    ch.basic_publish(ex, "b", b"2")
    ch.queue_unbind(q, ex, "a")
    ch.basic_publish(ex, "a", b"3")
    ch.basic_publish(ex, "b", b"4")
    assert bodies(get_all(ch, q)) == [b"1", b"2", b"4"]
    with channel_closed(404):
        ch.queue_bind(q, uid("missing-x"), "a")
    ch = conn.channel()
    with channel_closed(404):
        ch.queue_bind(uid("missing-q"), ex, "a")


def test_bindings_with_arguments_are_distinct(clients):
    _, ch = clients.channel()
    q = ch.queue_declare(uid("q"), exclusive=True).method.queue
    ch.queue_bind(q, "amq.headers", arguments={"x-match": "any", "h": q})
    ch.queue_bind(q, "amq.headers", arguments={"x-match": "any", "h2": q})
    ch.queue_unbind(q, "amq.headers", arguments={"x-match": "any", "h": q})
    ch.basic_publish("amq.headers", "", b"1", pika.BasicProperties(headers={"h": q}))
    ch.basic_publish("amq.headers", "", b"2", pika.BasicProperties(headers={"h2": q}))
    assert bodies(get_all(ch, q)) == [b"2"]


def test_purge_returns_count_and_keeps_unacked(clients):
    conn, ch = clients.channel()
    q = ch.queue_declare(uid("q"), exclusive=True).method.queue
    for i in range(7):
        ch.basic_publish("", q, str(i).encode())
    m, _, _ = ch.basic_get(q, auto_ack=False)  # one unacked
    assert ch.queue_purge(q).method.message_count == 6
    assert ch.queue_purge(q).method.message_count == 0
    ch.basic_nack(m.delivery_tag, requeue=True)
    msgs = get_all(ch, q)
    assert bodies(msgs) == [b"0"] and msgs[0][0].redelivered


def test_delete_returns_count(clients):
    _, ch = clients.channel()
    ch.confirm_delivery()
    q = clients.track_queue(uid("q"))
    ch.queue_declare(q)
    for _ in range(4):
        ch.basic_publish("", q, b"x")
    ch.queue_declare(q, passive=True)
    assert ch.queue_delete(q).method.message_count == 4
    with channel_closed(404):
        ch.queue_declare(q, passive=True)


def test_delete_missing_queue_is_ok(clients):
    _, ch = clients.channel()
    assert ch.queue_delete(uid("missing")).method.message_count == 0


def test_delete_if_unused_and_if_empty(clients):
    conn, ch = clients.channel()
    q = clients.track_queue(uid("q"))
    ch.queue_declare(q)
    ch.basic_consume(q, lambda *a: None)
    with channel_closed(406) as c:
        ch.queue_delete(q, if_unused=True)
    assert c.reply_text.startswith("PRECONDITION_FAILED") and q in c.reply_text
    ch = conn.channel()
    ch.confirm_delivery()
    # the consumer lived on the closed channel and is gone with it
    assert ch.queue_declare(q, passive=True).method.consumer_count == 0
    ch.basic_publish("", q, b"x")
    ch.queue_declare(q, passive=True)
    with channel_closed(406) as c:
        ch.queue_delete(q, if_empty=True)
    assert c.reply_text.startswith("PRECONDITION_FAILED") and q in c.reply_text
    ch = conn.channel()
    assert ch.queue_purge(q).method.message_count == 1
    assert ch.queue_delete(q, if_unused=True, if_empty=True).method.message_count == 0


def test_durable_queue_declare_and_delete(clients):
    _, ch = clients.channel()
    ch.confirm_delivery()
    q = clients.track_queue(uid("q"))
    ch.queue_declare(q, durable=True)
    ch.basic_publish("", q, b"p", pika.BasicProperties(delivery_mode=2))
    ok = ch.queue_declare(q, durable=True).method
    assert ok.message_count == 1
    assert ch.queue_delete(q).method.message_count == 1


@pytest.mark.parametrize("count", [1, 500])
def test_fifo_order(clients, count):
    _, ch = clients.channel()
    q = ch.queue_declare(uid("q"), exclusive=True).method.queue
    for i in range(count):
        ch.basic_publish("", q, str(i).encode())
    assert bodies(get_all(ch, q)) == [str(i).encode() for i in range(count)]


def test_message_properties_round_trip(clients):
    _, ch = clients.channel()
    q = ch.queue_declare(uid("q"), exclusive=True).method.queue
    props = pika.BasicProperties(
        content_type="application/json", content_encoding="utf-8", delivery_mode=2, priority=3,
        correlation_id="corr", reply_to="rt", expiration="60000", message_id="mid", timestamp=1700000000,
        type="kind", user_id="guest", app_id="app",
        headers={"s": "str", "i": 42, "neg": -7, "f": True, "l": [1, "two"], "t": {"n": "x"}},
    )
    body = bytes(range(256)) * 1000
    ch.basic_publish("", q, body, props)
    (method, got, data), = get_all(ch, q)
    assert data == body
    for attr in ("content_type", "content_encoding", "delivery_mode", "priority", "correlation_id",
                 "reply_to", "expiration", "message_id", "timestamp", "type", "user_id", "app_id"):
        assert getattr(got, attr) == getattr(props, attr), attr
    assert got.headers == props.headers


def test_empty_and_large_bodies(clients):
    _, ch = clients.channel()
    q = ch.queue_declare(uid("q"), exclusive=True).method.queue
    big = b"z" * (3 * 1024 * 1024 + 17)
    ch.basic_publish("", q, b"")
    ch.basic_publish("", q, big)
    got = get_all(ch, q)
    assert [len(b) for b in bodies(got)] == [0, len(big)]
    assert got[1][2] == big
