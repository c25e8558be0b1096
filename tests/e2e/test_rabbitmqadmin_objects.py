"""Debian's rabbitmqadmin (RabbitMQ's own management CLI) against lavinpy's HTTP API: queues,
exchanges, bindings, publish and get."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid

import pytest

RABBITMQADMIN = shutil.which("rabbitmqadmin")
pytestmark = pytest.mark.skipif(RABBITMQADMIN is None, reason="rabbitmqadmin is not installed")


def admin(broker, *args: str) -> str:
    host, port = broker.http_url.removeprefix("http://").rsplit(":", 1)
    cmd = [RABBITMQADMIN, "-H", host, "-P", port, "-u", "guest", "-p", "guest", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"{' '.join(args)} failed ({r.returncode}): {r.stdout}{r.stderr}"
    return r.stdout


def admin_json(broker, *args: str):
    return json.loads(admin(broker, "-f", "raw_json", *args))


def test_queues_exchanges_bindings_publish_get(broker, clients):
    suffix = uuid.uuid4().hex[:8]
    q, x = clients.track_queue(f"adm-q-{suffix}"), clients.track_exchange(f"adm-x-{suffix}")
    assert "queue declared" in admin(broker, "declare", "queue", f"name={q}", "durable=false",
                                     'arguments={"x-max-length": 5}')
    assert "exchange declared" in admin(broker, "declare", "exchange", f"name={x}", "type=topic")
    assert "binding declared" in admin(broker, "declare", "binding", f"source={x}", f"destination={q}",
                                       "routing_key=a.#")
    queues = {item["name"]: item for item in admin_json(broker, "list", "queues")}
    assert queues[q]["arguments"] == {"x-max-length": 5}
    assert {e["name"]: e["type"] for e in admin_json(broker, "list", "exchanges")}[x] == "topic"
    bindings = [(b["source"], b["destination"], b["routing_key"]) for b in admin_json(broker, "list", "bindings")]
    assert (x, q, "a.#") in bindings
    assert "Message published" in admin(broker, "publish", f"exchange={x}", "routing_key=a.b", "payload=hello")
    # the AMQP side sees what the CLI made
    _, ch = clients.channel()
    assert ch.queue_declare(q, passive=True, durable=False, arguments={"x-max-length": 5}).method.message_count == 1
    got = admin_json(broker, "get", f"queue={q}", "ackmode=ack_requeue_false")
    assert [(m["payload"], m["routing_key"], m["exchange"]) for m in got] == [("hello", "a.b", x)]
    assert ch.queue_declare(q, passive=True).method.message_count == 0
    assert "binding deleted" in admin(broker, "delete", "binding", f"source={x}", f"destination={q}",
                                      "destination_type=queue", "properties_key=a.%23")
    assert (x, q, "a.#") not in [(b["source"], b["destination"], b["routing_key"])
                                 for b in admin_json(broker, "list", "bindings")]
    assert "exchange deleted" in admin(broker, "delete", "exchange", f"name={x}")
    assert "queue deleted" in admin(broker, "delete", "queue", f"name={q}")
    assert q not in {item["name"] for item in admin_json(broker, "list", "queues")}


def test_purge_and_errors(broker, clients):
    q = clients.track_queue(f"adm-p-{uuid.uuid4().hex[:8]}")
    admin(broker, "declare", "queue", f"name={q}", "durable=false")
    for _ in range(3):
        admin(broker, "publish", "exchange=amq.default", f"routing_key={q}", "payload=x")
    assert admin_json(broker, "list", "queues", "name", "messages") and \
        {i["name"]: i["messages"] for i in admin_json(broker, "list", "queues", "name", "messages")}[q] == 3
    assert "queue purged" in admin(broker, "purge", "queue", f"name={q}")
    assert {i["name"]: i["messages"] for i in admin_json(broker, "list", "queues", "name", "messages")}[q] == 0
    host, port = broker.http_url.removeprefix("http://").rsplit(":", 1)
    r = subprocess.run([RABBITMQADMIN, "-H", host, "-P", port, "-u", "guest", "-p", "guest", "delete", "queue",
                        f"name=missing-{q}"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "Not found" in r.stdout + r.stderr
