"""Definitions move between a real RabbitMQ node (Debian's rabbitmq-server) and lavinpy, both ways.

A private node (own name, ports, data and plugins file; loopback only; the management plugin on a
free port) gets users with passwords, vhosts, permissions, policies, every built-in exchange type,
queues with arguments and bindings through its HTTP API. Its export imports into lavinpy and its
users log in over AMQP with their passwords; lavinpy's export then imports back into RabbitMQ.
"""

from __future__ import annotations

import json
from typing import Any

import pika
import pytest

from .conftest import http_call, lavinpy_only
from .rabbitmq_node import RabbitNode, needs_rabbitmq

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120),
              lavinpy_only("imports into a lavinpy started by the tests"),
              needs_rabbitmq]

FULL = {"configure": ".*", "write": ".*", "read": ".*"}


def _ok(broker: Any, method: str, path: str, body: Any = None) -> None:
    status, reply, _ = http_call(broker, method, path, body)
    assert status in (200, 201, 204), (method, path, status, reply)


def _populate_rabbit(node: RabbitNode) -> None:
    _ok(node, "PUT", "/api/vhosts/iv")
    _ok(node, "PUT", "/api/users/alice", {"password": "alice-pw", "tags": "administrator"})
    _ok(node, "PUT", "/api/users/bob", {"password": "bob-pw", "tags": "management"})
    for user in ("alice", "bob"):
        _ok(node, "PUT", f"/api/permissions/iv/{user}", FULL)
    _ok(node, "PUT", "/api/permissions/%2F/alice", {"configure": "^a", "write": "^a", "read": ".*"})
    _ok(node, "PUT", "/api/policies/iv/limits", {"pattern": "^lim", "apply-to": "queues", "priority": 1,
                                                 "definition": {"max-length": 3, "overflow": "reject-publish"}})
    _ok(node, "PUT", "/api/policies/iv/ae", {"pattern": "^x\\.direct$", "apply-to": "exchanges",
                                             "definition": {"alternate-exchange": "x.fanout"}})
    for name, kind in (("x.direct", "direct"), ("x.fanout", "fanout"), ("x.topic", "topic"),
                       ("x.headers", "headers")):
        _ok(node, "PUT", f"/api/exchanges/iv/{name}", {"type": kind, "durable": True})
    queues = {"work": {"x-message-ttl": 60000, "x-dead-letter-exchange": "x.fanout", "x-max-priority": 5},
              "limited": {}, "dead": {"x-max-length": 100}, "log": {"x-queue-type": "stream"}}
    for name, arguments in queues.items():
        _ok(node, "PUT", f"/api/queues/iv/{name}", {"durable": True, "arguments": arguments})
    _ok(node, "POST", "/api/bindings/iv/e/x.topic/q/work", {"routing_key": "job.#"})
    _ok(node, "POST", "/api/bindings/iv/e/x.fanout/q/dead", {"routing_key": ""})
    _ok(node, "POST", "/api/bindings/iv/e/x.headers/q/work",
        {"routing_key": "", "arguments": {"x-match": "any", "kind": "job"}})
    _ok(node, "POST", "/api/bindings/iv/e/x.direct/e/x.topic", {"routing_key": "job.new"})
    _ok(node, "POST", "/api/bindings/iv/e/x.direct/q/limited", {"routing_key": "lim"})


def _amqp(broker: Any, user: str, password: str, vhost: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(broker.url_for(user, password, vhost)))


def _check_objects(broker: Any, user: str, password: str) -> None:
    conn = _amqp(broker, user, password, "iv")
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for queue in ("work", "limited", "dead", "log"):
            ch.queue_declare(queue, passive=True)
        ch.queue_purge("work")
        ch.queue_purge("dead")
        ch.basic_publish("x.direct", "job.new", b"1")  # x.direct -> x.topic -> work
        ch.basic_publish("x.headers", "", b"2", pika.BasicProperties(headers={"kind": "job"}))
        ch.basic_publish("x.direct", "nowhere", b"3")  # alternate exchange x.fanout -> dead
        assert ch.queue_declare("work", passive=True).method.message_count == 2
        assert ch.queue_declare("dead", passive=True).method.message_count == 1
    finally:
        conn.close()


def test_definitions_round_trip_with_rabbitmq(rabbit: RabbitNode, fresh_broker) -> None:
    _populate_rabbit(rabbit)
    status, exported, _ = http_call(rabbit, "GET", "/api/definitions")
    assert status == 200
    # Into lavinpy, unchanged: the users log in with their passwords (RabbitMQ's hashes).
    status, reply, _ = http_call(fresh_broker, "POST", "/api/definitions", exported)
    assert status == 204, reply
    _amqp(fresh_broker, "bob", "bob-pw", "iv").close()
    _check_objects(fresh_broker, "alice", "alice-pw")
    assert http_call(fresh_broker, "GET", "/api/users/alice")[1]["tags"] == ["administrator"]
    assert http_call(fresh_broker, "GET", "/api/permissions/%2F/alice")[1]["configure"] == "^a"
    queues = {q["name"]: q for q in http_call(fresh_broker, "GET", "/api/definitions/iv")[1]["queues"]}
    assert queues["work"]["arguments"] == {"x-message-ttl": 60000, "x-dead-letter-exchange": "x.fanout",
                                           "x-max-priority": 5}
    conn = _amqp(fresh_broker, "alice", "alice-pw", "iv")
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", "limited", str(i).encode())
    with pytest.raises(pika.exceptions.NackError):  # the imported policy: max-length 3, reject-publish
        ch.basic_publish("", "limited", b"over")
    conn.close()

    # Back into RabbitMQ: lavinpy's export, after the vhost and users there are gone.
    status, ours, _ = http_call(fresh_broker, "GET", "/api/definitions")
    assert status == 200
    _ok(rabbit, "DELETE", "/api/vhosts/iv")
    for user in ("alice", "bob"):
        _ok(rabbit, "DELETE", f"/api/users/{user}")
    status, reply, _ = http_call(rabbit, "POST", "/api/definitions", ours)
    assert status in (200, 201, 204), reply
    _amqp(rabbit, "bob", "bob-pw", "iv").close()
    _check_objects(rabbit, "alice", "alice-pw")
    policies = {p["name"]: p for p in http_call(rabbit, "GET", "/api/policies/iv")[1]}
    assert policies["limits"]["definition"] == {"max-length": 3, "overflow": "reject-publish"}
    json.dumps(ours)  # plain JSON all the way

