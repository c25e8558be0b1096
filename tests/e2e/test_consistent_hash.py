"""Exchange type x-consistent-hash with pika against a real broker: weighted spread, hash-header and
hash-property, bad binding keys and arguments (406, the channel only), redeclare, exchange-to-exchange,
the type in the management API and the export, and the same key on the same queue after a restart."""

from __future__ import annotations

from collections import Counter

import pika
import pytest

from . import channel_closed, get_all, uid
from .conftest import http_call, lavinpy_only

CHX = "x-consistent-hash"


def _ring(ch, clients, weights: dict[str, int], *, durable: bool = False, **arguments) -> tuple[str, dict[str, str]]:
    """A consistent-hash exchange and one queue per weight; returns (exchange, weight name -> queue)."""
    ex = clients.track_exchange(uid("chx"))
    ch.exchange_declare(ex, CHX, durable=durable, arguments=arguments or None)
    queues = {}
    for label, weight in weights.items():
        q = clients.track_queue(uid(label))
        ch.queue_declare(q, durable=durable)
        ch.queue_bind(q, ex, str(weight))
        queues[label] = q
    return ex, queues


def _placed(ch, queues: dict[str, str]) -> dict[bytes, str]:
    """Drain the queues: which label each message body landed under."""
    placed = {}
    for label, q in queues.items():
        for _method, _props, body in get_all(ch, q):
            assert body not in placed
            placed[body] = label
    return placed


def test_routing_keys_spread_by_weight_and_stick_to_their_queue(clients):
    _, ch = clients.channel()
    ch.confirm_delivery()
    ex, queues = _ring(ch, clients, {"w1": 1, "w2": 2, "w3": 3})
    for i in range(3000):
        ch.basic_publish(ex, f"order-{i}", f"order-{i}".encode())
    first = _placed(ch, queues)
    counts = Counter(first.values())
    assert sum(counts.values()) == 3000, counts
    for label, weight in (("w1", 1), ("w2", 2), ("w3", 3)):
        assert abs(counts[label] - 500 * weight) <= 0.2 * 500 * weight, counts
    for i in range(0, 3000, 7):  # the same key again: the same queue
        ch.basic_publish(ex, f"order-{i}", f"order-{i}".encode())
    again = _placed(ch, queues)
    assert again and all(first[body] == label for body, label in again.items())


def test_hash_header_and_hash_property(clients):
    _, ch = clients.channel()
    ch.confirm_delivery()
    by_header, header_queues = _ring(ch, clients, {"a": 1, "b": 1, "c": 1}, **{"hash-header": "customer"})
    by_id, id_queues = _ring(ch, clients, {"a": 1, "b": 1, "c": 1}, **{"hash-property": "message_id"})
    by_lavinmq, lavinmq_queues = _ring(ch, clients, {"a": 1, "b": 1, "c": 1}, **{"x-hash-on": "customer"})
    for round_ in range(2):  # another routing key each round: the header or property decides
        for i in range(300):
            body = f"{i}".encode()
            ch.basic_publish(by_header, f"rk-{round_}-{i}", body,
                             pika.BasicProperties(headers={"customer": f"c-{i}"}))
            ch.basic_publish(by_lavinmq, f"rk-{round_}-{i}", body,
                             pika.BasicProperties(headers={"customer": f"c-{i}"}))
            ch.basic_publish(by_id, f"rk-{round_}-{i}", body, pika.BasicProperties(message_id=f"id-{i}"))
        placed = (_placed(ch, header_queues), _placed(ch, lavinmq_queues), _placed(ch, id_queues))
        for each in placed:
            assert len(each) == 300 and set(each.values()) == {"a", "b", "c"}
        if round_ == 0:
            first = placed
        else:
            assert placed == first
    for i in range(30):  # without the header: all to one queue, as the plugin does
        ch.basic_publish(by_header, f"rk-{i}", b"no header")
    assert sum(1 for q in header_queues.values() if ch.queue_declare(q, passive=True).method.message_count) == 1


@pytest.mark.parametrize(("key", "text"), [
    ("one", 'PRECONDITION_FAILED - The binding key must be an integer: <<"one">>'),
    ("", "PRECONDITION_FAILED - The binding key must be an integer: <<>>"),
    ("0", "PRECONDITION_FAILED - The binding key must be greater than 0"),
    ("10001", "PRECONDITION_FAILED - The binding key must not exceed 10000"),
])
def test_a_bad_binding_key_closes_the_channel_with_406(clients, key, text):
    conn, ch = clients.channel()
    ex, queues = _ring(ch, clients, {"ok": 1})
    q = clients.track_queue(uid("bad"))
    ch.queue_declare(q)
    with channel_closed(406) as closed:
        ch.queue_bind(q, ex, key)
    assert closed.reply_text == text
    ch = conn.channel()  # the connection stays open; nothing was bound
    ch.confirm_delivery()
    ch.basic_publish(ex, "k", b"x")
    assert ch.queue_declare(queues["ok"], passive=True).method.message_count == 1
    assert ch.queue_declare(q, passive=True).method.message_count == 0


def test_bad_arguments_and_redeclare(clients):
    conn, ch = clients.channel()
    with channel_closed(406, "hash-header and hash-property are mutually exclusive"):
        ch.exchange_declare(uid("chx"), CHX, arguments={"hash-header": "h", "hash-property": "message_id"})
    ch = conn.channel()
    with channel_closed(406, "Unsupported property: app_id"):
        ch.exchange_declare(uid("chx"), CHX, arguments={"hash-property": "app_id"})
    ch = conn.channel()
    with channel_closed(406, "unacceptable_type"):
        ch.exchange_declare(uid("chx"), CHX, arguments={"hash-header": 7})
    ch = conn.channel()
    ex = clients.track_exchange(uid("chx"))
    ch.exchange_declare(ex, CHX, arguments={"hash-header": "h"})
    ch.exchange_declare(ex, CHX, arguments={"hash-header": "h"})  # equivalent: fine
    ch.exchange_declare(ex, passive=True)
    with channel_closed(406, "inequivalent arg 'type'"):
        ch.exchange_declare(ex, "direct", arguments={"hash-header": "h"})


def test_exchange_to_exchange_unbind_and_queue_delete(clients):
    _, ch = clients.channel()
    ch.confirm_delivery()
    front = clients.track_exchange(uid("front"))
    ch.exchange_declare(front, "topic")
    ex, queues = _ring(ch, clients, {"a": 1, "b": 1})
    ch.exchange_bind(ex, front, "orders.#")  # topic -> consistent hash
    fan = clients.track_exchange(uid("fan"))
    ch.exchange_declare(fan, "fanout")
    ch.exchange_bind(fan, ex, "2")  # consistent hash -> fanout, weight 2
    q_fan = clients.track_queue(uid("via-fan"))
    ch.queue_declare(q_fan)
    ch.queue_bind(q_fan, fan)
    for i in range(400):
        ch.basic_publish(front, f"orders.{i}", f"{i}".encode())
    placed = _placed(ch, {**queues, "fan": q_fan})
    counts = Counter(placed.values())
    assert len(placed) == 400 and counts["fan"] > max(counts["a"], counts["b"]), counts
    ch.exchange_unbind(fan, ex, "2")
    ch.queue_delete(queues["b"])
    for i in range(100):
        ch.basic_publish(front, f"orders.{i}", f"{i}".encode())
    assert ch.queue_declare(queues["a"], passive=True).method.message_count == 100


def test_listed_with_its_type_in_the_api_and_the_export(broker, clients):
    _, ch = clients.channel()
    ex, queues = _ring(ch, clients, {"a": 3}, durable=True, **{"hash-property": "correlation_id"})
    status, info, _ = http_call(broker, "GET", f"/api/exchanges/%2F/{ex}")
    assert status == 200 and info["type"] == CHX and info["arguments"] == {"hash-property": "correlation_id"}
    status, bindings, _ = http_call(broker, "GET", f"/api/exchanges/%2F/{ex}/bindings/source")
    assert status == 200 and [b["routing_key"] for b in bindings] == ["3"]
    status, doc, _ = http_call(broker, "GET", "/api/definitions")
    assert status == 200
    [exported] = [e for e in doc["exchanges"] if e["name"] == ex]
    assert exported["type"] == CHX and exported["arguments"] == {"hash-property": "correlation_id"}
    assert any(b["source"] == ex and b["routing_key"] == "3" for b in doc["bindings"])
    # declared over HTTP too, and a bad binding key there is a 400 naming the problem
    other = clients.track_exchange(uid("chx-http"))
    assert http_call(broker, "PUT", f"/api/exchanges/%2F/{other}", {"type": CHX})[0] == 201
    status, body, _ = http_call(broker, "POST", f"/api/bindings/%2F/e/{other}/q/{queues['a']}",
                                {"routing_key": "heavy"})
    assert status == 400 and "The binding key must be an integer" in body["reason"], (status, body)


@lavinpy_only()
def test_the_same_key_reaches_the_same_queue_after_a_restart(fresh_broker, fresh_clients):
    _, ch = fresh_clients.channel()
    ch.confirm_delivery()
    ex, queues = _ring(ch, fresh_clients, {"w3": 3, "w1": 1, "w2": 2}, durable=True)
    for i in range(1000):
        ch.basic_publish(ex, f"user-{i}", f"user-{i}".encode())
    before = _placed(ch, queues)
    assert len(before) == 1000 and set(before.values()) == {"w1", "w2", "w3"}
    fresh_clients.close_connections()
    fresh_broker.restart()
    _, ch = fresh_clients.channel()
    ch.confirm_delivery()
    for i in range(1000):
        ch.basic_publish(ex, f"user-{i}", f"user-{i}".encode())
    assert _placed(ch, queues) == before


def test_a_message_with_cc_keys_reaches_one_queue_of_the_ring(clients):
    """RabbitMQ's exchange hashes a message's routing keys (its own and the CC/BCC ones) once: one copy,
    where a direct exchange delivers one per key."""
    _, ch = clients.channel()
    ch.confirm_delivery()
    ex, queues = _ring(ch, clients, {"a": 1, "b": 1, "c": 1, "d": 1})
    for i in range(200):
        headers = {"CC": [f"cc-{i}-{n}" for n in range(5)], "BCC": [f"bcc-{i}"]}
        ch.basic_publish(ex, f"key-{i}", f"m{i}".encode(), pika.BasicProperties(headers=headers))
    placed = _placed(ch, queues)  # asserts each body landed once
    assert len(placed) == 200 and len(set(placed.values())) > 1, Counter(placed.values())
    direct = clients.track_exchange(uid("cc-direct"))
    ch.exchange_declare(direct, "direct")
    targets = [clients.track_queue(uid("cc")) for _ in range(3)]
    for n, q in enumerate(targets):
        ch.queue_declare(q)
        ch.queue_bind(q, direct, f"k{n}")
    ch.basic_publish(direct, "k0", b"each", pika.BasicProperties(headers={"CC": ["k1"], "BCC": ["k2"]}))
    assert [len(get_all(ch, q)) for q in targets] == [1, 1, 1]
