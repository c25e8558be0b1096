"""Exchanges: the built-in ones, routing by type, declare/delete rules, e2e bindings, AE, CC/BCC, reply-to."""

from __future__ import annotations

import pika
import pytest

from . import bodies, channel_closed, consume, get_all, settle, uid, wait_until


def _queue(ch, **kw) -> str:
    return ch.queue_declare(uid("q"), exclusive=True, **kw).method.queue


def test_default_exchange_routes_by_queue_name(clients):
    _, ch = clients.channel()
    q = _queue(ch)
    ch.basic_publish("", q, b"hello")
    ch.basic_publish("", q + "-nope", b"lost")
    assert bodies(get_all(ch, q)) == [b"hello"]


def test_default_exchange_cannot_be_bound_or_deleted(clients):
    conn, ch = clients.channel()
    q = _queue(ch)
    with channel_closed(403) as c:
        ch.queue_bind(q, "", routing_key="k")
    assert c.reply_text.startswith("ACCESS_REFUSED")
    ch = conn.channel()
    with channel_closed(403):
        ch.exchange_delete("")


def test_builtin_exchanges_exist(clients):
    _, ch = clients.channel()
    for name, kind in [("amq.direct", "direct"), ("amq.fanout", "fanout"), ("amq.topic", "topic"),
                       ("amq.headers", "headers"), ("amq.match", "headers")]:
        ch.exchange_declare(name, passive=True)
        ch.exchange_declare(name, kind, durable=True)  # an equivalent redeclare is fine


def test_amq_direct(clients):
    _, ch = clients.channel()
    q1, q2 = _queue(ch), _queue(ch)
    ch.queue_bind(q1, "amq.direct", routing_key="k1")
    ch.queue_bind(q2, "amq.direct", routing_key="k2")
    ch.queue_bind(q2, "amq.direct", routing_key="k1")
    ch.basic_publish("amq.direct", "k1", b"a")
    ch.basic_publish("amq.direct", "k2", b"b")
    ch.basic_publish("amq.direct", "k3", b"c")
    assert bodies(get_all(ch, q1)) == [b"a"]
    assert bodies(get_all(ch, q2)) == [b"a", b"b"]


def test_amq_fanout_ignores_routing_key(clients):
    _, ch = clients.channel()
    qs = [_queue(ch) for _ in range(3)]
    for q in qs:
        ch.queue_bind(q, "amq.fanout", routing_key=uid("rk"))
    ch.basic_publish("amq.fanout", "anything", b"x")
    for q in qs:
        assert bodies(get_all(ch, q)) == [b"x"]


TOPIC_CASES = {
    "a.*.c": {"a.b.c"},
    "a.#": {"a", "a.b", "a.c", "a.b.c", "a.b.b.c"},
    "#.c": {"c", "a.c", "a.b.c", "a.b.b.c"},
    "a.#.c": {"a.c", "a.b.c", "a.b.b.c"},
    "*.b.*": {"a.b.c"},
    "*": {"a", "c", "b"},
    "#": {"a", "a.b", "a.c", "a.b.c", "a.b.b.c", "b.a", "c", "b", "d.e.f"},
    "a.b": {"a.b"},
    "*.*": {"a.b", "a.c", "b.a"},
    "b.#.#": {"b", "b.a"},
}
TOPIC_KEYS = ["a", "a.b", "a.c", "a.b.c", "a.b.b.c", "b.a", "c", "b", "d.e.f"]


def test_amq_topic_patterns(clients):
    _, ch = clients.channel()
    prefix = uid("tp").replace("-", "")
    queues = {}
    for pattern in TOPIC_CASES:
        q = _queue(ch)
        ch.queue_bind(q, "amq.topic", routing_key=f"{prefix}.{pattern}")
        queues[pattern] = q
    for key in TOPIC_KEYS:
        ch.basic_publish("amq.topic", f"{prefix}.{key}", key.encode())
    for pattern, expected in TOPIC_CASES.items():
        got = {b.decode() for b in bodies(get_all(ch, queues[pattern]))}
        assert got == expected, f"pattern {pattern!r}"


def test_topic_message_routed_once_per_queue(clients):
    _, ch = clients.channel()
    q = _queue(ch)
    ex = clients.track_exchange(uid("x"))
    ch.exchange_declare(ex, "topic", auto_delete=False)
    for pattern in ("a.*", "a.#", "#", "a.b"):
        ch.queue_bind(q, ex, routing_key=pattern)
    ch.basic_publish(ex, "a.b", b"once")
    assert bodies(get_all(ch, q)) == [b"once"]


@pytest.mark.parametrize("exchange", ["amq.headers", "amq.match"])
def test_headers_exchange_x_match(clients, exchange):
    _, ch = clients.channel()
    tag = uid("h")
    bindings = {
        "all": {"x-match": "all", "tag": tag, "a": "1", "b": "2"},
        "any": {"x-match": "any", "tag2": tag, "a": "1", "b": "2"},
        "default": {"tag": tag, "a": "1"},  # no x-match: all
        "all-with-x": {"x-match": "all-with-x", "tag": tag, "x-kind": "k"},
        "any-with-x": {"x-match": "any-with-x", "tag2": tag, "x-kind": "k"},
        "all-x-ignored": {"x-match": "all", "tag": tag, "x-kind": "k"},
    }
    queues = {}
    for name, args in bindings.items():
        q = _queue(ch)
        ch.queue_bind(q, exchange, arguments=args)
        queues[name] = q
    messages = {
        "m1": {"tag": tag, "a": "1", "b": "2"},
        "m2": {"tag": tag, "a": "1"},
        "m3": {"tag2": tag},
        "m4": {"b": "2"},
        "m5": {"tag": tag, "x-kind": "k"},
        "m6": {"x-kind": "k"},
        "m7": {"tag": tag, "a": "2", "b": "2"},
        "m8": {},
    }
    for body, headers in messages.items():
        ch.basic_publish(exchange, "ignored", body.encode(), pika.BasicProperties(headers=headers))
    expected = {
        "all": {"m1"},
        "any": {"m1", "m2", "m3", "m4", "m7"},
        "default": {"m1", "m2"},
        "all-with-x": {"m5"},
        "any-with-x": {"m3", "m5", "m6"},
        "all-x-ignored": {"m1", "m2", "m5", "m7"},  # x- arguments do not take part with plain all
    }
    for name, q in queues.items():
        got = {b.decode() for b in bodies(get_all(ch, q))}
        assert got == expected[name], name


def test_declare_kinds_and_redeclare(clients):
    conn, ch = clients.channel()
    for kind in ("direct", "fanout", "topic", "headers"):
        ex = clients.track_exchange(uid("x"))
        ch.exchange_declare(ex, kind)
        ch.exchange_declare(ex, kind)  # same again: fine
        ch.exchange_declare(ex, passive=True)
    ex = clients.track_exchange(uid("x"))
    ch.exchange_declare(ex, "direct")
    with channel_closed(406) as c:
        ch.exchange_declare(ex, "fanout")
    assert c.reply_text.startswith("PRECONDITION_FAILED") and ex in c.reply_text
    ch = conn.channel()
    with channel_closed(406):
        ch.exchange_declare(ex, "direct", durable=True)
    ch = conn.channel()
    with channel_closed(406):
        ch.exchange_declare(ex, "direct", auto_delete=True)


def test_passive_declare_of_missing_exchange_is_404(clients):
    _, ch = clients.channel()
    name = uid("x")
    with channel_closed(404) as c:
        ch.exchange_declare(name, passive=True)
    assert c.reply_text.startswith("NOT_FOUND") and name in c.reply_text


def test_unknown_exchange_type_is_406_on_the_channel(clients):
    """RabbitMQ 4's answer (3.x closed the connection with 503); the connection goes on."""
    conn, ch = clients.channel()
    with channel_closed(406) as c:
        ch.exchange_declare(uid("x"), "no-such-type")
    assert c.reply_text == "PRECONDITION_FAILED - unknown exchange type 'no-such-type'"
    assert conn.is_open and conn.channel().is_open


def test_reserved_amq_prefix_is_403(clients):
    conn, ch = clients.channel()
    with channel_closed(403) as c:
        ch.exchange_declare("amq." + uid("x"), "direct")
    assert c.reply_text.startswith("ACCESS_REFUSED")
    ch = conn.channel()
    with channel_closed(403):
        ch.exchange_delete("amq.direct")


def test_publish_to_missing_exchange_is_404(clients):
    _, ch = clients.channel()
    name = uid("x")
    with channel_closed(404) as c:
        ch.basic_publish(name, "k", b"x")
        ch.basic_qos(prefetch_count=0)
    assert name in c.reply_text


def test_auto_delete_exchange_goes_with_last_binding(clients):
    conn, ch = clients.channel()
    ex = uid("x")
    ch.exchange_declare(ex, "direct", auto_delete=True)
    q1, q2 = _queue(ch), _queue(ch)
    ch.queue_bind(q1, ex, "k")
    ch.queue_bind(q2, ex, "k")
    ch.queue_unbind(q1, ex, "k")
    ch.exchange_declare(ex, passive=True)  # one binding left: still there
    ch.queue_unbind(q2, ex, "k")
    with channel_closed(404):
        ch.exchange_declare(ex, passive=True)


def test_auto_delete_exchange_goes_when_its_queue_is_deleted(clients):
    conn, ch = clients.channel()
    ex = uid("x")
    ch.exchange_declare(ex, "fanout", auto_delete=True)
    q = _queue(ch)
    ch.queue_bind(q, ex)
    ch.queue_delete(q)
    with channel_closed(404):
        ch.exchange_declare(ex, passive=True)


def test_auto_delete_exchange_without_bindings_stays(clients):
    _, ch = clients.channel()
    ex = clients.track_exchange(uid("x"))
    ch.exchange_declare(ex, "direct", auto_delete=True)
    settle(ch.connection, 0.2)
    ch.exchange_declare(ex, passive=True)


def test_internal_exchange_refuses_publishes_but_routes_from_exchanges(clients):
    conn, ch = clients.channel()
    internal, front = clients.track_exchange(uid("xi")), clients.track_exchange(uid("xf"))
    ch.exchange_declare(internal, "fanout", internal=True)
    ch.exchange_declare(front, "fanout")
    ch.exchange_bind(internal, front)
    q = _queue(ch)
    ch.queue_bind(q, internal)
    ch.basic_publish(front, "", b"via-e2e")
    assert bodies(get_all(ch, q)) == [b"via-e2e"]
    with channel_closed(403) as c:
        ch.basic_publish(internal, "", b"direct")
        ch.basic_qos(prefetch_count=0)
    assert c.reply_text.startswith("ACCESS_REFUSED") and internal in c.reply_text


def test_delete_if_unused(clients):
    conn, ch = clients.channel()
    ex = uid("x")
    ch.exchange_declare(ex, "direct")
    q = _queue(ch)
    ch.queue_bind(q, ex, "k")
    with channel_closed(406) as c:
        ch.exchange_delete(ex, if_unused=True)
    assert c.reply_text.startswith("PRECONDITION_FAILED")
    ch = conn.channel()
    ch.queue_unbind(q, ex, "k")
    ch.exchange_delete(ex, if_unused=True)
    with channel_closed(404):
        ch.exchange_declare(ex, passive=True)


def test_delete_removes_bindings(clients):
    _, ch = clients.channel()
    ex = uid("x")
    ch.exchange_declare(ex, "fanout")
    q = _queue(ch)
    ch.queue_bind(q, ex)
    ch.exchange_delete(ex)
    ch.exchange_declare(ex, "fanout")
    clients.track_exchange(ex)
    ch.basic_publish(ex, "", b"x")
    assert get_all(ch, q) == []  # the old binding went with the old exchange


def test_exchange_to_exchange_bind_and_unbind(clients):
    _, ch = clients.channel()
    src, dst = clients.track_exchange(uid("xs")), clients.track_exchange(uid("xd"))
    ch.exchange_declare(src, "topic")
    ch.exchange_declare(dst, "direct")
    ch.exchange_bind(destination=dst, source=src, routing_key="a.*")
    q = _queue(ch)
    ch.queue_bind(q, dst, "a.b")
    ch.basic_publish(src, "a.b", b"1")
    ch.basic_publish(src, "a.c", b"2")  # reaches dst, but dst has no binding for a.c
    ch.basic_publish(src, "b.b", b"3")
    assert bodies(get_all(ch, q)) == [b"1"]
    ch.exchange_unbind(destination=dst, source=src, routing_key="a.*")
    ch.basic_publish(src, "a.b", b"4")
    assert get_all(ch, q) == []


def test_exchange_binding_cycle_delivers_once(clients):
    _, ch = clients.channel()
    x1, x2 = clients.track_exchange(uid("x1")), clients.track_exchange(uid("x2"))
    ch.exchange_declare(x1, "fanout")
    ch.exchange_declare(x2, "fanout")
    ch.exchange_bind(x2, x1)
    ch.exchange_bind(x1, x2)
    q = _queue(ch)
    ch.queue_bind(q, x1)
    ch.queue_bind(q, x2)
    ch.basic_publish(x1, "", b"loop")
    assert bodies(get_all(ch, q)) == [b"loop"]


def test_exchange_bind_to_missing_exchange_is_404(clients):
    _, ch = clients.channel()
    ex = clients.track_exchange(uid("x"))
    ch.exchange_declare(ex, "fanout")
    with channel_closed(404):
        ch.exchange_bind(ex, uid("missing"))


def test_alternate_exchange(clients):
    conn, ch = clients.channel()
    ae, main = clients.track_exchange(uid("ae")), clients.track_exchange(uid("main"))
    ch.exchange_declare(ae, "fanout")
    ch.exchange_declare(main, "direct", arguments={"alternate-exchange": ae})
    q_main, q_ae = _queue(ch), _queue(ch)
    ch.queue_bind(q_main, main, "known")
    ch.queue_bind(q_ae, ae)
    returned = []
    ch.add_on_return_callback(lambda *a: returned.append(a))
    ch.basic_publish(main, "known", b"routed")
    ch.basic_publish(main, "unknown", b"to-ae", mandatory=True)
    settle(conn, 0.3)
    assert returned == []  # routed through the AE: not returned
    assert bodies(get_all(ch, q_main)) == [b"routed"]
    msgs = get_all(ch, q_ae)
    assert bodies(msgs) == [b"to-ae"]
    assert msgs[0][0].exchange == main and msgs[0][0].routing_key == "unknown"


def test_mandatory_unroutable_is_returned_312(clients):
    conn, ch = clients.channel()
    returned = []
    ch.add_on_return_callback(lambda _ch, method, props, body: returned.append((method, props, body)))
    key = uid("nowhere")
    ch.basic_publish("amq.direct", key, b"ret", pika.BasicProperties(message_id="m1"), mandatory=True)
    ch.basic_publish("amq.direct", key, b"dropped")  # not mandatory: silently dropped
    assert wait_until(conn, lambda: len(returned) >= 1)
    settle(conn, 0.3)
    assert len(returned) == 1
    method, props, body = returned[0]
    assert (method.reply_code, method.reply_text) == (312, "NO_ROUTE")
    assert (method.exchange, method.routing_key) == ("amq.direct", key)
    assert body == b"ret" and props.message_id == "m1"


def test_cc_and_bcc_headers(clients):
    _, ch = clients.channel()
    k1, k2, k3 = uid("k"), uid("k"), uid("k")
    q1, q2, q3 = _queue(ch), _queue(ch), _queue(ch)
    ch.queue_bind(q1, "amq.direct", k1)
    ch.queue_bind(q2, "amq.direct", k2)
    ch.queue_bind(q3, "amq.direct", k3)
    ch.basic_publish("amq.direct", k1, b"cc",
                     pika.BasicProperties(headers={"CC": [k2], "BCC": [k3], "other": "v"}))
    for q in (q1, q2, q3):
        msgs = get_all(ch, q)
        assert bodies(msgs) == [b"cc"], q
        headers = msgs[0][1].headers
        assert "BCC" not in headers
        assert headers["CC"] == [k2]
        assert headers["other"] == "v"
        assert msgs[0][0].routing_key == k1


def test_direct_reply_to(clients):
    client_conn, client_ch = clients.channel()
    server_conn, server_ch = clients.channel()
    rpc_q = server_ch.queue_declare(uid("rpc"), exclusive=True).method.queue

    def serve(ch, method, props, body):
        assert props.reply_to.startswith("amq.rabbitmq.reply-to.")
        ch.basic_publish("", props.reply_to, b"reply:" + body,
                         pika.BasicProperties(correlation_id=props.correlation_id))
        ch.basic_ack(method.delivery_tag)

    server_ch.basic_consume(rpc_q, serve)
    replies = []
    client_ch.basic_consume("amq.rabbitmq.reply-to",
                            lambda ch, m, p, b: replies.append((p.correlation_id, b)), auto_ack=True)
    for i in range(3):
        client_ch.basic_publish("", rpc_q, f"req{i}".encode(),
                                pika.BasicProperties(reply_to="amq.rabbitmq.reply-to", correlation_id=str(i)))

    def done():
        server_conn.process_data_events(time_limit=0)
        return len(replies) >= 3

    assert wait_until(client_conn, done, timeout=10)
    assert sorted(replies) == [("0", b"reply:req0"), ("1", b"reply:req1"), ("2", b"reply:req2")]


def test_direct_reply_to_needs_a_no_ack_consumer(clients):
    conn, ch = clients.channel()
    with channel_closed(406):
        ch.basic_consume("amq.rabbitmq.reply-to", lambda *a: None, auto_ack=False)
    ch = conn.channel()
    q = ch.queue_declare(uid("rpc"), exclusive=True).method.queue
    with channel_closed(406):
        ch.basic_publish("", q, b"x", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
        ch.basic_qos(prefetch_count=0)


def test_unbind_stops_routing_to_consumer(clients):
    _, ch = clients.channel()
    q = _queue(ch)
    ch.queue_bind(q, "amq.direct", "k-" + q)
    ch.basic_publish("amq.direct", "k-" + q, b"1")
    ch.queue_unbind(q, "amq.direct", "k-" + q)
    ch.basic_publish("amq.direct", "k-" + q, b"2")
    got = consume(ch.connection, ch, q, 1, timeout=1, auto_ack=True)
    assert bodies(got) == [b"1"]
