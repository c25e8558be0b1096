"""Quorum queues with real clients: pika declares (accepted, and each refusal with RabbitMQ 4's 406 text
while the connection stays usable), the type everywhere (HTTP API, lavinpyctl, Prometheus), the default
delivery limit with x-delivery-count, and confirmed messages surviving kill -9."""

from __future__ import annotations

import time
import urllib.parse
import urllib.request
from typing import Any

import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families

from . import channel_closed, persistent, uid
from .conftest import http_call, lavinpy_only

QUORUM = {"x-queue-type": "quorum"}


def _where(name: str) -> str:
    return f"queue '{name}' in vhost '/'"


def test_declare_publish_consume(clients) -> None:
    conn, ch = clients.channel()
    name = clients.track_queue(uid("qq"))
    args = {**QUORUM, "x-quorum-initial-group-size": 3, "x-delivery-limit": 5, "x-max-length": 100,
            "x-overflow": "reject-publish", "x-dead-letter-strategy": "at-most-once", "x-message-ttl": 60000,
            "x-expires": 3600000, "x-single-active-consumer": True, "x-max-length-bytes": 1 << 20}
    ch.queue_declare(name, durable=True, arguments=args)
    ch.queue_declare(name, durable=True, arguments=args)  # the same declaration again is equivalent
    ch.confirm_delivery()
    ch.basic_publish("", name, b"hello", persistent())
    method, _, body = ch.basic_get(name, auto_ack=True)
    assert body == b"hello" and not method.redelivered


@pytest.mark.parametrize("flags, arguments, text", [
    ({"durable": False}, {}, "invalid property 'non-durable' for {where}"),
    ({"auto_delete": True}, {}, "invalid property 'auto-delete' for {where}"),
    ({"exclusive": True}, {}, "invalid property 'exclusive-owner' for {where}"),
    ({}, {"x-max-priority": 10}, "invalid arg 'x-max-priority' for {where} of queue type rabbit_quorum_queue"),
    ({}, {"x-queue-mode": "lazy"}, "invalid arg 'x-queue-mode' for {where} of queue type rabbit_quorum_queue"),
    ({}, {"x-queue-master-locator": "min-masters"},
     "invalid arg 'x-queue-master-locator' for {where} of queue type rabbit_quorum_queue"),
    ({}, {"x-max-age": "1D"}, "invalid arg 'x-max-age' for {where} of queue type rabbit_quorum_queue"),
    ({}, {"x-quorum-initial-group-size": 0}, "invalid arg 'x-quorum-initial-group-size' for {where}: "
                                              "{{value_zero,0}}"),
    ({}, {"x-dead-letter-strategy": "sometimes"}, "invalid arg 'x-dead-letter-strategy' for {where}: "
                                                  "invalid_dlx_strategy"),
    ({}, {"x-overflow": "drop-tail"}, "invalid arg 'x-overflow' for {where}: invalid_overflow"),
])
def test_refused_declarations(clients, flags: dict[str, bool], arguments: dict[str, Any], text: str) -> None:
    conn, ch = clients.channel()
    name = clients.track_queue(uid("qq-bad"))
    declare: dict[str, Any] = {"durable": True, **flags}
    with channel_closed(406) as closed:
        ch.queue_declare(name, arguments={**QUORUM, **arguments}, **declare)
    assert closed.reply_text == "PRECONDITION_FAILED - " + text.format(where=_where(name))
    ch2 = conn.channel()  # the connection is still usable; nothing was declared
    with channel_closed(404):
        ch2.queue_declare(name, passive=True)
    conn.channel().queue_declare(name, durable=True, arguments=QUORUM)


def test_server_named_refused(clients) -> None:
    conn, ch = clients.channel()
    with channel_closed(406, "Cannot declare a server-named queue for type rabbit_quorum_queue"):
        ch.queue_declare("", durable=True, arguments=QUORUM)
    assert conn.channel().is_open


def test_redeclare_type_equivalence(clients) -> None:
    conn, ch = clients.channel()
    quorum = clients.track_queue(uid("qq"))
    ch.queue_declare(quorum, durable=True, arguments=QUORUM)
    with channel_closed(406) as closed:
        ch.queue_declare(quorum, durable=True)
    assert closed.reply_text == (f"PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for {_where(quorum)}: "
                                 "received 'classic' but current is 'quorum'")
    ch = conn.channel()
    with channel_closed(406, "received 'classic' but current is 'quorum'"):
        ch.queue_declare(quorum, durable=True, arguments={"x-queue-type": "classic"})
    ch = conn.channel()
    ch.queue_declare(quorum, passive=True)  # a passive declare checks nothing
    classic = clients.track_queue(uid("classic"))
    ch.queue_declare(classic, durable=True)
    ch.queue_declare(classic, durable=True, arguments={"x-queue-type": "classic"})  # classic spelled out
    with channel_closed(406, "received 'quorum' but current is 'classic'"):
        ch.queue_declare(classic, durable=True, arguments=QUORUM)


def test_default_delivery_limit_and_delivery_count(clients) -> None:
    conn, ch = clients.channel()
    name = clients.track_queue(uid("qq"))
    dead = clients.track_queue(uid("qq-dead"))
    ch.queue_declare(dead, durable=True, arguments=QUORUM)
    ch.queue_declare(name, durable=True, arguments={**QUORUM, "x-dead-letter-exchange": "",
                                                     "x-dead-letter-routing-key": dead})
    ch.basic_publish("", name, b"job", persistent())
    counts = []
    for _ in range(21):  # the default limit is 20 returns; the 21st return dead-letters the message
        method, props, _ = ch.basic_get(name)
        assert method is not None
        counts.append((props.headers or {}).get("x-delivery-count"))
        ch.basic_nack(method.delivery_tag, requeue=True)
    assert counts == [None] + list(range(1, 21))
    time.sleep(0.2)
    assert ch.basic_get(name)[0] is None
    method, props, body = ch.basic_get(dead, auto_ack=True)
    assert body == b"job"
    assert props.headers["x-death"][0]["reason"] == "delivery_limit"


def test_type_in_http_api_ctl_and_metrics(broker, clients) -> None:
    conn, ch = clients.channel()
    name = clients.track_queue(uid("qq"))
    ch.queue_declare(name, durable=True, arguments={**QUORUM, "x-quorum-initial-group-size": 3})
    status, queue, _ = http_call(broker, "GET", f"/api/queues/%2F/{urllib.parse.quote(name, safe='')}")
    assert status == 200
    assert queue["type"] == "quorum"
    assert queue["arguments"] == {"x-queue-type": "quorum", "x-quorum-initial-group-size": 3}
    assert queue["leader"] == queue["node"] and queue["members"] == [queue["node"]] == queue["online"]
    status, listed, _ = http_call(broker, "GET", "/api/queues/%2F")
    assert [q["type"] for q in listed if q["name"] == name] == ["quorum"]
    # declared over HTTP as rabbitmqadmin does
    other = clients.track_queue(uid("qq-http"))
    status, _, _ = http_call(broker, "PUT", f"/api/queues/%2F/{other}", {"durable": True, "arguments": QUORUM})
    assert status in (201, 204)
    status, body, _ = http_call(broker, "PUT", f"/api/queues/%2F/{uid('qq-http-bad')}",
                                {"durable": False, "arguments": QUORUM})
    assert status == 400 and "non-durable" in body["reason"], body

    from .test_ctl import ctl  # the lavinpyctl runner of the ctl tests
    done = ctl(broker, "-f", "tsv", "list_queues", "name", "type", "leader", "members")
    assert done.returncode == 0, done.stderr
    rows = {line.split("\t")[0]: line.split("\t")[1:] for line in done.stdout.splitlines()}
    assert rows[name][0] == "quorum" and rows[name][1] == queue["node"]


@lavinpy_only("the Prometheus endpoint of a lavinpy started by the tests")
def test_metrics_label(broker, clients) -> None:
    conn, ch = clients.channel()
    name = clients.track_queue(uid("qq"))
    ch.queue_declare(name, durable=True, arguments=QUORUM)
    ch.basic_publish("", name, b"x", persistent())
    ch.basic_get(name, auto_ack=True)
    with urllib.request.urlopen(broker.metrics_url + "/metrics?prefix=rabbitmq", timeout=30) as response:
        text = response.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    samples = [s for s in families["rabbitmq_global_messages_delivered"].samples
               if s.labels.get("queue_type") == "rabbit_quorum_queue" and not s.name.endswith("_created")]
    assert samples and sum(s.value for s in samples) >= 1


@lavinpy_only("kills the lavinpy process started by the test")
def test_confirmed_messages_survive_kill9(fresh_broker) -> None:
    name = "qq-durable"
    conn = pika.BlockingConnection(pika.URLParameters(fresh_broker.url))
    ch = conn.channel()
    ch.queue_declare(name, durable=True, arguments={**QUORUM, "x-delivery-limit": 3})
    ch.confirm_delivery()
    for i in range(500):
        ch.basic_publish("", name, str(i).encode(), persistent())  # each one confirmed before the next
    method, _, _ = ch.basic_get(name)
    ch.basic_nack(method.delivery_tag, requeue=True)  # one return, counted on disk
    ch.queue_declare(name, passive=True)  # a synchronous call: the nack is handled before the answer
    fresh_broker.kill9()
    fresh_broker.start()
    conn = pika.BlockingConnection(pika.URLParameters(fresh_broker.url))
    ch = conn.channel()
    ok = ch.queue_declare(name, durable=True, arguments={**QUORUM, "x-delivery-limit": 3})
    assert ok.method.message_count == 500
    got = []
    first_count = None
    for _ in range(500):
        method, props, body = ch.basic_get(name, auto_ack=True)
        if body == b"0":
            first_count = (props.headers or {}).get("x-delivery-count")
        got.append(int(body))
    assert sorted(got) == list(range(500))
    assert first_count == 1
    status, queue, _ = http_call(fresh_broker, "GET", f"/api/queues/%2F/{name}")
    assert queue["type"] == "quorum"
    conn.close()


def test_definitions_import_and_export(broker, clients) -> None:
    """A RabbitMQ export's quorum queue imports as one and exports with its type argument; one refused
    quorum queue refuses the whole document (400 naming it), nothing applied."""
    good, bad = clients.track_queue(uid("qq-def")), clients.track_queue(uid("qq-def-bad"))
    queue = {"name": good, "vhost": "/", "durable": True, "auto_delete": False, "type": "quorum",
             "arguments": {"x-queue-type": "quorum", "x-delivery-limit": 7}}
    refused = {**queue, "name": bad, "auto_delete": True}
    status, body, _ = http_call(broker, "POST", "/api/definitions", {"queues": [queue, refused]})
    assert status == 400 and bad in body["reason"] and "auto-delete" in body["reason"], body
    assert http_call(broker, "GET", f"/api/queues/%2F/{good}")[0] == 404
    assert http_call(broker, "POST", "/api/definitions", {"queues": [queue]})[0] in (200, 201, 204)
    status, info, _ = http_call(broker, "GET", f"/api/queues/%2F/{good}")
    assert info["type"] == "quorum" and info["arguments"]["x-delivery-limit"] == 7
    status, doc, _ = http_call(broker, "GET", "/api/definitions")
    [exported] = [q for q in doc["queues"] if q["name"] == good]
    assert exported["arguments"] == {"x-queue-type": "quorum", "x-delivery-limit": 7}


def test_vhost_default_queue_type(broker, clients) -> None:
    """A vhost whose default queue type is quorum: a declaration without x-queue-type makes a quorum queue
    when it can be one, a classic queue otherwise (RabbitMQ 4's rule)."""
    vhost = uid("dqt")
    assert http_call(broker, "PUT", f"/api/vhosts/{vhost}", {"default_queue_type": "quorum"})[0] in (201, 204)
    assert http_call(broker, "PUT", f"/api/permissions/{vhost}/guest",
                     {"configure": ".*", "write": ".*", "read": ".*"})[0] in (201, 204)
    try:
        _conn, ch = clients.channel(broker.url_for("guest", "guest", vhost))
        ch.queue_declare("durable-q", durable=True)
        ch.queue_declare("exclusive-q", exclusive=True)
        ch.queue_declare("durable-q", durable=True)  # a redeclare without the type is equivalent
        types = {q["name"]: q["type"] for q in http_call(broker, "GET", f"/api/queues/{vhost}")[1]}
        assert types == {"durable-q": "quorum", "exclusive-q": "classic"}
    finally:
        http_call(broker, "DELETE", f"/api/vhosts/{vhost}")
