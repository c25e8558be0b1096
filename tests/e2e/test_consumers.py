"""Consumers: tags, exclusivity, no-ack, priorities, cancel both ways, round-robin, QoS."""

from __future__ import annotations

import pika

from . import bodies, channel_closed, get_all, settle, uid, wait_until
from .rawamqp import RawAMQP, commands


def _queue(ch, **kw) -> str:
    return ch.queue_declare(uid("q"), exclusive=True, **kw).method.queue


def _publish(ch, q, n, start=0):
    for i in range(start, start + n):
        ch.basic_publish("", q, str(i).encode())


def _collector():
    got = []

    def cb(ch, method, props, body):
        got.append((method, props, body))
    return got, cb


def test_generated_consumer_tag(broker):
    """An empty consumer tag gets a server-generated "amq.ctag-..." one (pika makes its own, so raw)."""
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        q = c.call(1, commands.Queue.Declare(queue="", exclusive=True), commands.Queue.DeclareOk).queue
        tags = {c.call(1, commands.Basic.Consume(queue=q, consumer_tag=""), commands.Basic.ConsumeOk
                       ).consumer_tag for _ in range(3)}
        assert len(tags) == 3
        assert all(t.startswith("amq.ctag-") and len(t) > len("amq.ctag-") + 8 for t in tags), tags
        own = c.call(1, commands.Basic.Consume(queue=q, consumer_tag="my-tag"), commands.Basic.ConsumeOk)
        assert own.consumer_tag == "my-tag"


def test_deliveries_carry_consumer_tag_and_increasing_delivery_tags(clients):
    conn, ch = clients.channel()
    q = _queue(ch)
    got, cb = _collector()
    tag = ch.basic_consume(q, cb)
    _publish(ch, q, 5)
    assert wait_until(conn, lambda: len(got) == 5)
    assert [m.consumer_tag for m, _, _ in got] == [tag] * 5
    assert [m.delivery_tag for m, _, _ in got] == [1, 2, 3, 4, 5]
    assert [m.redelivered for m, _, _ in got] == [False] * 5
    assert [(m.exchange, m.routing_key) for m, _, _ in got] == [("", q)] * 5
    assert bodies(got) == [b"0", b"1", b"2", b"3", b"4"]


def test_duplicate_consumer_tag_is_530(broker):
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        q = c.call(1, commands.Queue.Declare(queue="", exclusive=True), commands.Queue.DeclareOk).queue
        c.call(1, commands.Basic.Consume(queue=q, consumer_tag="dup"), commands.Basic.ConsumeOk)
        c.send(1, commands.Basic.Consume(queue=q, consumer_tag="dup"))
        close = c.expect_connection_close()
        assert close.reply_code == 530
        assert close.reply_text.startswith("NOT_ALLOWED") and "dup" in close.reply_text


def test_consume_missing_queue_is_404(clients):
    _, ch = clients.channel()
    with channel_closed(404):
        ch.basic_consume(uid("missing"), lambda *a: None)


def test_exclusive_consumer(clients):
    conn, ch = clients.channel()
    q = clients.track_queue(uid("q"))
    ch.queue_declare(q)
    ch.basic_consume(q, lambda *a: None, exclusive=True)
    other_conn, other = clients.channel()
    with channel_closed(403) as c:
        other.basic_consume(q, lambda *a: None)
    assert c.reply_text.startswith("ACCESS_REFUSED") and q in c.reply_text
    # and an exclusive consumer cannot join a queue that already has consumers
    q2 = clients.track_queue(uid("q"))
    ch.queue_declare(q2)
    ch.basic_consume(q2, lambda *a: None)
    other = other_conn.channel()
    with channel_closed(403):
        other.basic_consume(q2, lambda *a: None, exclusive=True)


def test_exclusive_consumer_gone_frees_queue(clients):
    conn, ch = clients.channel()
    q = clients.track_queue(uid("q"))
    ch.queue_declare(q)
    tag = ch.basic_consume(q, lambda *a: None, exclusive=True)
    ch.basic_cancel(tag)
    _, other = clients.channel()
    other.basic_consume(q, lambda *a: None)


def test_no_ack_consumer(clients):
    conn, ch = clients.channel()
    ch.confirm_delivery()
    q = _queue(ch)
    _publish(ch, q, 20)
    got, cb = _collector()
    ch.basic_consume(q, cb, auto_ack=True)
    assert wait_until(conn, lambda: len(got) == 20)
    assert bodies(got) == [str(i).encode() for i in range(20)]
    ch2 = conn.channel()
    ch2.close()  # closing another channel requeues nothing: nothing was unacked
    ok = ch.queue_declare(q, passive=True).method
    assert ok.message_count == 0


def test_messages_published_before_consume_are_delivered(clients):
    conn, ch = clients.channel()
    q = _queue(ch)
    _publish(ch, q, 3)
    got, cb = _collector()
    ch.basic_consume(q, cb, auto_ack=True)
    assert wait_until(conn, lambda: len(got) == 3)


def test_client_cancel_stops_deliveries_and_keeps_unacked(clients):
    conn, ch = clients.channel()
    ch.confirm_delivery()
    q = _queue(ch)
    got, cb = _collector()
    tag = ch.basic_consume(q, cb)
    _publish(ch, q, 3)
    assert wait_until(conn, lambda: len(got) == 3)
    ch.basic_cancel(tag)
    _publish(ch, q, 2, start=3)
    settle(conn, 0.3)
    assert len(got) == 3
    for m, _, _ in got:  # deliveries of a cancelled consumer can still be acked
        ch.basic_ack(m.delivery_tag)
    ok = ch.queue_declare(q, passive=True).method
    assert (ok.message_count, ok.consumer_count) == (2, 0)
    assert bodies(get_all(ch, q)) == [b"3", b"4"]


def test_cancel_unknown_tag_is_ok(broker):
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        ok = c.call(1, commands.Basic.Cancel(consumer_tag="nope"), commands.Basic.CancelOk)
        assert ok.consumer_tag == "nope"


def test_server_cancels_consumers_of_deleted_queue(clients):
    conn, ch = clients.channel()
    q = clients.track_queue(uid("q"))
    ch.queue_declare(q)
    cancelled = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag1 = ch.basic_consume(q, lambda *a: None)
    tag2 = ch.basic_consume(q, lambda *a: None)
    _, other = clients.channel()
    other.queue_delete(q)
    assert wait_until(conn, lambda: len(cancelled) == 2)
    assert sorted(cancelled) == sorted([tag1, tag2])
    # the channel stays usable
    q2 = _queue(ch)
    ch.basic_publish("", q2, b"still-open")
    assert bodies(get_all(ch, q2)) == [b"still-open"]


def test_server_cancel_raw(broker):
    """The server's basic.cancel carries the consumer tag and nowait=false is not required of it."""
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        q = uid("q")
        c.call(1, commands.Queue.Declare(queue=q, exclusive=True), commands.Queue.DeclareOk)
        c.call(1, commands.Basic.Consume(queue=q, consumer_tag="ctag-raw"), commands.Basic.ConsumeOk)
        c.open_channel(2)
        c.send(2, commands.Queue.Delete(queue=q))
        seen = []
        while len(seen) < 2:
            ch, f = c.recv()
            if isinstance(f, commands.Basic.Cancel):
                assert (ch, f.consumer_tag) == (1, "ctag-raw")
                seen.append("cancel")
            elif isinstance(f, commands.Queue.DeleteOk):
                assert ch == 2
                seen.append("delete-ok")
        assert sorted(seen) == ["cancel", "delete-ok"]


def test_round_robin_between_consumers(clients):
    conn, ch = clients.channel()
    q = _queue(ch)
    ch1, ch2 = conn.channel(), conn.channel()
    got1, cb1 = _collector()
    got2, cb2 = _collector()
    ch1.basic_consume(q, cb1, auto_ack=True)
    ch2.basic_consume(q, cb2, auto_ack=True)
    _publish(ch, q, 20)
    assert wait_until(conn, lambda: len(got1) + len(got2) == 20)
    b1 = [int(b) for b in bodies(got1)]
    b2 = [int(b) for b in bodies(got2)]
    assert len(b1) == len(b2) == 10
    assert b1 == sorted(b1) and b2 == sorted(b2)
    assert sorted(b1 + b2) == list(range(20))


def test_round_robin_of_runs_between_three_consumers(clients):
    """Deliveries to several consumers go out a round of turns at a time (one run per consumer):
    still one message per turn in ring order, each consumer's and each channel's window honoured."""
    conn, ch = clients.channel()
    q = _queue(ch)
    chans = [conn.channel() for _ in range(3)]
    chans[2].basic_qos(prefetch_count=300, global_qos=True)  # a channel-wide window
    collected = []
    for c in chans:
        got, cb = _collector()
        collected.append(got)
        c.basic_qos(prefetch_count=400)
        c.basic_consume(q, cb)
    _publish(ch, q, 1200)
    assert wait_until(conn, lambda: sum(map(len, collected)) == 1100)
    settle(conn, 0.2)
    assert [len(got) for got in collected] == [400, 400, 300]
    numbers = [[int(b) for b in bodies(got)] for got in collected]
    for got, mine in zip(collected, numbers, strict=True):
        assert mine == sorted(mine)
        assert [m.delivery_tag for m, _p, _b in got] == list(range(1, len(got) + 1))
    # while all three had room, turns went round: every third message to each
    for mine in numbers:
        assert all(b - a == 3 for a, b in zip(mine[:299], mine[1:300], strict=True))
    # then the two with room left alternated
    assert all(b - a == 2 for a, b in zip(numbers[0][300:399], numbers[0][301:400], strict=True))
    assert sorted(sum(numbers, [])) == list(range(1100))
    assert ch.queue_declare(q, passive=True).method.message_count == 100


def test_round_robin_honours_prefetch(clients):
    conn, ch = clients.channel()
    q = _queue(ch)
    slow, fast = conn.channel(), conn.channel()
    slow.basic_qos(prefetch_count=1)
    fast.basic_qos(prefetch_count=100)
    got_slow, cb_slow = _collector()
    got_fast, cb_fast = _collector()
    slow.basic_consume(q, cb_slow)  # never acks
    fast_list = got_fast

    def cb_fast_ack(c, m, p, b):
        cb_fast(c, m, p, b)
        c.basic_ack(m.delivery_tag)
    fast.basic_consume(q, cb_fast_ack)
    _publish(ch, q, 30)
    assert wait_until(conn, lambda: len(got_slow) + len(fast_list) == 30)
    settle(conn, 0.2)
    assert len(got_slow) == 1
    assert len(fast_list) == 29


def test_prefetch_per_consumer(clients):
    """basic.qos global=false limits each consumer of the channel on its own (RabbitMQ semantics)."""
    conn, ch = clients.channel()
    q1, q2 = _queue(ch), _queue(ch)
    _publish(ch, q1, 10)
    _publish(ch, q2, 10)
    c = conn.channel()
    c.basic_qos(prefetch_count=3, global_qos=False)
    got1, cb1 = _collector()
    got2, cb2 = _collector()
    c.basic_consume(q1, cb1)
    c.basic_consume(q2, cb2)
    assert wait_until(conn, lambda: len(got1) >= 3 and len(got2) >= 3)
    settle(conn, 0.3)
    assert (len(got1), len(got2)) == (3, 3)
    c.basic_ack(got1[0][0].delivery_tag)
    assert wait_until(conn, lambda: len(got1) == 4)
    settle(conn, 0.2)
    assert (len(got1), len(got2)) == (4, 3)
    c.basic_ack(0, multiple=True)
    assert wait_until(conn, lambda: len(got1) == 7 and len(got2) == 6)
    settle(conn, 0.2)
    assert (len(got1), len(got2)) == (7, 6)


def test_prefetch_global_is_per_channel(clients):
    """basic.qos global=true limits all consumers of the channel together."""
    conn, ch = clients.channel()
    q1, q2 = _queue(ch), _queue(ch)
    _publish(ch, q1, 10)
    _publish(ch, q2, 10)
    c = conn.channel()
    c.basic_qos(prefetch_count=4, global_qos=True)
    got1, cb1 = _collector()
    got2, cb2 = _collector()
    c.basic_consume(q1, cb1)
    c.basic_consume(q2, cb2)
    assert wait_until(conn, lambda: len(got1) + len(got2) >= 4)
    settle(conn, 0.3)
    assert len(got1) + len(got2) == 4
    last = (got1 + got2)[-1][0].delivery_tag
    c.basic_ack(last)
    assert wait_until(conn, lambda: len(got1) + len(got2) == 5)
    settle(conn, 0.2)
    assert len(got1) + len(got2) == 5


def test_prefetch_zero_is_unlimited(clients):
    conn, ch = clients.channel()
    q = _queue(ch)
    _publish(ch, q, 200)
    c = conn.channel()
    c.basic_qos(prefetch_count=0)
    got, cb = _collector()
    c.basic_consume(q, cb)
    assert wait_until(conn, lambda: len(got) == 200)


def test_basic_get_ignores_prefetch(clients):
    conn, ch = clients.channel()
    q = _queue(ch)
    _publish(ch, q, 5)
    ch.basic_qos(prefetch_count=1)
    msgs = get_all(ch, q, auto_ack=False)
    assert len(msgs) == 5


def test_consumer_priority(clients):
    conn, ch = clients.channel()
    q = _queue(ch)
    hi, lo = conn.channel(), conn.channel()
    hi.basic_qos(prefetch_count=5)
    lo.basic_qos(prefetch_count=100)
    got_hi, cb_hi = _collector()
    got_lo, cb_lo = _collector()
    lo.basic_consume(q, cb_lo, arguments={"x-priority": 0})
    hi.basic_consume(q, cb_hi, arguments={"x-priority": 10})
    _publish(ch, q, 5)
    assert wait_until(conn, lambda: len(got_hi) == 5)
    settle(conn, 0.2)
    assert len(got_lo) == 0, "the low-priority consumer got messages while the high one had room"
    _publish(ch, q, 5, start=5)  # the high-priority consumer is full (prefetch 5): these go to lo
    assert wait_until(conn, lambda: len(got_lo) == 5)
    assert bodies(got_lo) == [str(i).encode() for i in range(5, 10)]
    hi.basic_ack(0, multiple=True)
    _publish(ch, q, 3, start=10)
    assert wait_until(conn, lambda: len(got_hi) == 8)
    settle(conn, 0.2)
    assert len(got_lo) == 5


def test_redelivered_flag_after_requeue(clients):
    conn, ch = clients.channel()
    q = _queue(ch)
    ch.basic_publish("", q, b"once")
    got, cb = _collector()
    c = conn.channel()
    c.basic_qos(prefetch_count=1)
    c.basic_consume(q, cb)
    assert wait_until(conn, lambda: len(got) == 1)
    assert got[0][0].redelivered is False
    c.basic_reject(got[0][0].delivery_tag, requeue=True)
    assert wait_until(conn, lambda: len(got) == 2)
    assert got[1][0].redelivered is True and got[1][2] == b"once"
    assert got[1][0].delivery_tag == 2


def test_consumer_on_exclusive_queue_of_other_connection_is_405(clients):
    _, owner = clients.channel()
    q = _queue(owner)
    _, other = clients.channel()
    with channel_closed(405):
        other.basic_consume(q, lambda *a: None)


def test_publisher_and_consumer_on_separate_connections(clients):
    pub_conn, pub = clients.channel()
    con_conn, con = clients.channel()
    q = con.queue_declare(uid("q"), exclusive=True).method.queue
    got, cb = _collector()
    con.basic_consume(q, cb, auto_ack=True)
    for i in range(100):
        pub.basic_publish("", q, str(i).encode(), pika.BasicProperties(message_id=str(i)))
    pub_conn.process_data_events(0)
    assert wait_until(con_conn, lambda: len(got) == 100)
    assert [p.message_id for _, p, _ in got] == [str(i) for i in range(100)]
