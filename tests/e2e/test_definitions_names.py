"""Names as RabbitMQ takes them, over AMQP: a durable queue and exchange named in UTF-8 with spaces and
punctuation (what RabbitMQ's federation declares) are declared, kept through kill -9, exported and
imported, where a 541 INTERNAL_ERROR used to close the connection."""

from __future__ import annotations

import pika

from .conftest import http_call, lavinpy_only

pytestmark = lavinpy_only("kill -9 and the management API of a lavinpy started by the tests")

NAMES = ["ünï", "federation: x -> rabbit@h", "日本語 🐇 " + "é" * 60, "x" * 255]


def _connect(b) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(b.url))


def _check(b, messages: int) -> None:
    conn = _connect(b)
    try:
        ch = conn.channel()
        for name in NAMES:
            ch.exchange_declare(name, "topic", durable=True, passive=True)
            assert ch.queue_declare(name, durable=True, passive=True).method.message_count == messages
    finally:
        conn.close()


def test_utf8_and_punctuated_names_survive_kill9_and_definitions(fresh_broker):
    b = fresh_broker
    conn = _connect(b)
    ch = conn.channel()
    ch.confirm_delivery()
    for name in NAMES:
        ch.exchange_declare(name, "topic", durable=True)
        ch.queue_declare(name, durable=True)
        ch.queue_bind(name, name, "k.#")
        ch.basic_publish(name, "k.1", b"kept", pika.BasicProperties(delivery_mode=2))
    assert conn.is_open
    conn.close()
    b.kill9()
    b.start()
    _check(b, 1)
    status, doc, _ = http_call(b, "GET", "/api/definitions")
    assert status == 200
    for name in NAMES:
        assert {"source": name, "vhost": "/", "destination": name, "destination_type": "queue",
                "routing_key": "k.#", "arguments": {}} in doc["bindings"]
    conn = _connect(b)
    ch = conn.channel()
    for name in NAMES:
        ch.queue_delete(name)
        ch.exchange_delete(name)
    conn.close()
    assert http_call(b, "POST", "/api/definitions", doc)[0] == 204
    b.kill9()
    b.start()
    _check(b, 0)
    conn = _connect(b)
    ch = conn.channel()
    ch.confirm_delivery()
    for name in NAMES:
        ch.basic_publish(name, "k.2", b"routed")  # the imported binding routes
    conn.close()
    _check(b, 1)
