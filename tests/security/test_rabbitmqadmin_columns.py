"""Debian's rabbitmqadmin prints every column of every object kind as a table, never a traceback (a null
field, such as a queue's policy when it has none, ended it in "TypeError: object of type 'NoneType'
has no len()")."""

from __future__ import annotations

import shutil
import subprocess

import pika
import pytest

from tests.e2e.conftest import http_call

RABBITMQADMIN = shutil.which("rabbitmqadmin")
pytestmark = pytest.mark.skipif(RABBITMQADMIN is None, reason="rabbitmqadmin is not installed")

# The columns RabbitMQ's documentation and rabbitmqadmin's own defaults name for each kind; the test
# adds every column the API gives.
DOCUMENTED = {
    "queues": ["name", "vhost", "type", "durable", "auto_delete", "exclusive", "arguments", "policy", "operator_policy",
               "effective_policy_definition", "messages", "messages_ready", "messages_unacknowledged", "consumers",
               "consumer_capacity", "consumer_utilisation", "exclusive_consumer_tag", "single_active_consumer_tag",
               "head_message_timestamp", "memory", "node", "state", "idle_since", "message_stats.publish"],
    "exchanges": ["name", "vhost", "type", "durable", "auto_delete", "internal", "arguments", "policy",
                  "message_stats.publish_in"],
    "bindings": ["source", "destination", "destination_type", "routing_key", "arguments", "properties_key", "vhost"],
    "connections": ["name", "user", "channels", "vhost", "peer_host", "peer_port", "ssl", "ssl_protocol",
                    "ssl_cipher", "peer_cert_subject", "peer_cert_issuer", "peer_cert_validity", "auth_mechanism",
                    "protocol", "client_properties", "state", "timeout", "frame_max", "user_who_performed_action"],
    "channels": ["name", "user", "vhost", "number", "consumer_count", "prefetch_count", "confirm", "transactional",
                 "messages_unacknowledged", "user_who_performed_action"],
    "consumers": ["consumer_tag", "queue", "channel_details", "ack_required", "exclusive", "prefetch_count",
                  "arguments", "active", "activity_status"],
    "users": ["name", "tags", "password_hash", "hashing_algorithm", "limits"],
    "vhosts": ["name", "messages", "tracing", "description", "tags", "default_queue_type", "metadata"],
    "permissions": ["user", "vhost", "configure", "write", "read"],
    "nodes": ["name", "type", "mem_used", "running", "uptime"],
    "parameters": ["component", "vhost", "name", "value"],
    "policies": ["vhost", "name", "pattern", "apply-to", "definition", "priority"],
    "operator_policies": ["vhost", "name", "pattern", "apply-to", "definition", "priority"],
    "vhost_limits": ["vhost", "value"],
}
ROUTES = {"operator_policies": "operator-policies", "vhost_limits": "vhost-limits"}


def _columns(items: list, prefix: str = "") -> set[str]:
    """The dotted column names rabbitmqadmin makes of the API's objects (nested objects flattened)."""
    found: set[str] = set()
    for item in items:
        for key, value in item.items():
            column = f"{prefix}{key}"
            if isinstance(value, dict) and value:
                found |= _columns([value], column + ".")
            else:
                found.add(column)
    return found


def _admin(broker, *args: str) -> str:
    host, port = broker.http_url.removeprefix("http://").rsplit(":", 1)
    done = subprocess.run([RABBITMQADMIN, "-H", host, "-P", port, "-u", "guest", "-p", "guest", *args],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "Traceback" not in done.stderr, f"{args[:3]}: {done.stdout}{done.stderr[-2000:]}"
    return done.stdout


def test_every_column_of_every_kind_prints(fresh_broker):
    b = fresh_broker
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    for name, kind in (("cq", "classic"), ("qq", "quorum"), ("sq", "stream"), ("pol.q", "classic")):
        ch.queue_declare(name, durable=True, arguments={"x-queue-type": kind})
        ch.basic_publish("", name, b"m", pika.BasicProperties(delivery_mode=2))
    exclusive = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_consume(exclusive, lambda *a: None, exclusive=True)
    ch.basic_consume("cq", lambda *a: None)
    ch.exchange_declare("pol.x", "topic")
    ch.queue_bind("cq", "pol.x", "a.#")
    assert http_call(b, "PUT", "/api/policies/%2F/pol",
                     {"pattern": "^pol\\.", "definition": {"max-length": 9}})[0] == 201
    assert http_call(b, "PUT", "/api/operator-policies/%2F/op",
                     {"pattern": "^none", "definition": {"max-length": 99}})[0] == 201
    assert http_call(b, "PUT", "/api/vhost-limits/%2F/max-queues", {"value": 1000})[0] == 204
    assert http_call(b, "PUT", "/api/users/plain", {"password": "p", "tags": ""})[0] == 201
    assert http_call(b, "PUT", "/api/vhosts/other", {})[0] == 201
    for kind, documented in DOCUMENTED.items():
        items = http_call(b, "GET", f"/api/{ROUTES.get(kind, kind)}")[1]
        assert items, kind
        columns = sorted(set(documented) | _columns(items))
        table = _admin(b, "list", kind, *columns)
        assert table.count("\n") >= 4, (kind, table)  # header rule, header, rule, a row or more
        _admin(b, "-f", "tsv", "list", kind, *columns)
        _admin(b, "list", kind)  # rabbitmqadmin's own choice of columns
    # The queue without a policy: an empty cell, not a crash.
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in _admin(b, "list", "queues", "name", "policy",
                                                                         "operator_policy").splitlines()
            if line.startswith("|")]
    assert ["cq", "", ""] in rows and ["pol.q", "pol", ""] in rows
    conn.close()
