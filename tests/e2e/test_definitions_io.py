"""Definitions export/import (GET/POST /api/definitions) and load_definitions at boot."""

from __future__ import annotations

import json

import pika
import pika.exceptions
import pytest

from .conftest import http_call, lavinpy_only, rabbit_password_hash

pytestmark = lavinpy_only("management API of a lavinpy started by the tests")

FULL = {"configure": ".*", "write": ".*", "read": ".*"}


def _amqp(broker, user: str, password: str, vhost: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(broker.url_for(user, password, vhost)))


def _populate(b) -> None:
    ok = (201,)
    assert http_call(b, "PUT", "/api/vhosts/dv", {"description": "definitions"})[0] in ok
    assert http_call(b, "PUT", "/api/users/imp", {"password": "imp-pw", "tags": "management"})[0] in ok
    assert http_call(b, "PUT", "/api/permissions/dv/imp", FULL)[0] in ok
    assert http_call(b, "PUT", "/api/policies/dv/lim", {"pattern": "^limited$", "apply-to": "queues",
                                                        "definition": {"max-length": 1}})[0] in ok
    conn = _amqp(b, "imp", "imp-pw", "dv")
    ch = conn.channel()
    for name, kind in (("x.direct", "direct"), ("x.fanout", "fanout"), ("x.topic", "topic"),
                       ("x.headers", "headers")):
        ch.exchange_declare(name, kind, durable=True)
    ch.queue_declare("work", durable=True, arguments={"x-message-ttl": 60000, "x-max-priority": 3})
    ch.queue_declare("limited", durable=True)
    ch.queue_bind("work", "x.topic", "a.#")
    ch.queue_bind("work", "x.headers", "", arguments={"x-match": "all", "k": "v"})
    ch.exchange_bind("x.topic", "x.fanout", "")
    conn.close()


def _check_populated(b) -> None:
    conn = _amqp(b, "imp", "imp-pw", "dv")
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("work", passive=True)
        ch.queue_purge("work")
        ch.basic_publish("x.fanout", "a.b", b"via fanout then topic")  # e2e binding, then a.#
        ch.basic_publish("x.headers", "", b"h", pika.BasicProperties(headers={"k": "v"}))
        assert ch.queue_declare("work", passive=True).method.message_count == 2
        for i in range(3):
            ch.basic_publish("", "limited", str(i).encode())
        assert ch.queue_declare("limited", passive=True).method.message_count == 1  # the policy
    finally:
        conn.close()


def test_export_delete_import_round_trip(fresh_broker):
    b = fresh_broker
    _populate(b)
    status, doc, _ = http_call(b, "GET", "/api/definitions")
    assert status == 200
    for key in ("rabbit_version", "users", "vhosts", "permissions", "topic_permissions", "parameters",
                "global_parameters", "policies", "queues", "exchanges", "bindings"):
        assert key in doc
    assert {(x["name"], x["type"]) for x in doc["exchanges"] if x["vhost"] == "dv"} == {
        ("x.direct", "direct"), ("x.fanout", "fanout"), ("x.topic", "topic"), ("x.headers", "headers")}
    work = next(q for q in doc["queues"] if q["name"] == "work")
    assert work == {"name": "work", "vhost": "dv", "durable": True, "auto_delete": False,
                    "arguments": {"x-message-ttl": 60000, "x-max-priority": 3}}
    assert {"source": "x.fanout", "vhost": "dv", "destination": "x.topic", "destination_type": "exchange",
            "routing_key": "", "arguments": {}} in doc["bindings"]
    # Delete everything, then import the export.
    assert http_call(b, "DELETE", "/api/vhosts/dv")[0] == 204
    assert http_call(b, "DELETE", "/api/users/imp")[0] == 204
    assert http_call(b, "POST", "/api/definitions", doc)[0] == 204
    _check_populated(b)
    assert http_call(b, "GET", "/api/policies/dv/lim")[0] == 200
    # A second import of the same file changes nothing and fails nothing.
    assert http_call(b, "POST", "/api/definitions", doc)[0] == 204
    assert http_call(b, "GET", "/api/definitions")[1] == doc


def test_vhost_export_imports_into_another_vhost(fresh_broker):
    b = fresh_broker
    _populate(b)
    status, doc, _ = http_call(b, "GET", "/api/definitions/dv")
    assert status == 200 and "users" not in doc and all("vhost" not in q for q in doc["queues"])
    assert http_call(b, "PUT", "/api/vhosts/copy")[0] == 201
    assert http_call(b, "PUT", "/api/permissions/copy/imp", FULL)[0] == 201
    assert http_call(b, "POST", "/api/definitions/copy", doc)[0] == 204
    assert {q["name"] for q in http_call(b, "GET", "/api/definitions/copy")[1]["queues"]} == {"work", "limited"}


def test_bad_file_applies_nothing_and_names_the_object(fresh_broker):
    b = fresh_broker
    doc = {
        "users": [{"name": "newbie", "password_hash": rabbit_password_hash("pw"),
                   "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": ""}],
        "vhosts": [{"name": "nv"}],
        "permissions": [{"user": "newbie", "vhost": "nv", **FULL}],
        "exchanges": [{"name": "ok.x", "vhost": "nv", "type": "topic", "durable": True,
                       "auto_delete": False, "internal": False, "arguments": {}}],
        "queues": [{"name": "broken", "vhost": "nv", "durable": True, "auto_delete": False,
                    "arguments": {"x-max-length": "ten"}}],
    }
    status, body, _ = http_call(b, "POST", "/api/definitions", doc)
    assert status == 400 and body["error"] == "bad_request"
    assert "'broken'" in body["reason"] and "x-max-length" in body["reason"]
    assert http_call(b, "GET", "/api/users/newbie")[0] == 404
    assert http_call(b, "GET", "/api/vhosts/nv")[0] == 404
    for bad, needle in (
        ({"policies": [{"vhost": "/", "name": "p", "pattern": ".*", "definition": {"nope": 1}}]}, "nope"),
        ({"exchanges": [{"name": "e", "vhost": "/", "type": "x-unknown"}]}, "'e'"),
        ({"bindings": [{"source": "missing", "vhost": "/", "destination": "q", "destination_type": "queue",
                        "routing_key": "", "arguments": {}}]}, "missing"),
        ({"permissions": [{"user": "ghost", "vhost": "/", **FULL}]}, "ghost"),
        ({"users": [{"name": "u2", "password_hash": "x", "hashing_algorithm": "bcrypt"}]}, "u2"),
        ({"queues": [{"name": "q", "vhost": "nowhere"}]}, "nowhere"),
    ):
        status, body, _ = http_call(b, "POST", "/api/definitions", bad)
        assert status == 400 and needle in body["reason"], (bad, body)
    status, body, _ = http_call(b, "POST", "/api/definitions", raw=b"[1, 2")
    assert status == 400 and "JSON" in body["reason"]
    assert http_call(b, "GET", "/api/definitions")[1]["queues"] == []


def test_dry_run_reports_and_changes_nothing(fresh_broker):
    b = fresh_broker
    doc = {"users": [{"name": "dry", "password": "pw", "tags": "management"}],
           "vhosts": [{"name": "dryv"}],
           "queues": [{"name": "dq", "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}}]}
    status, body, _ = http_call(b, "POST", "/api/definitions?dry_run=true", doc)
    assert status == 200 and body["dry_run"] is True
    assert {"type": "user", "name": "dry", "change": "create"} in body["changes"]
    assert {"type": "vhost", "name": "dryv", "change": "create"} in body["changes"]
    assert {"type": "queue", "name": "dq", "vhost": "/", "change": "create"} in body["changes"]
    assert http_call(b, "GET", "/api/users/dry")[0] == 404
    assert http_call(b, "GET", "/api/vhosts/dryv")[0] == 404
    assert http_call(b, "GET", "/api/definitions")[1]["queues"] == []
    bad = {**doc, "queues": [{"name": "dq", "vhost": "/", "arguments": {"x-expires": 0}}]}
    status, body, _ = http_call(b, "POST", "/api/definitions?dry_run=true", bad)
    assert status == 400 and "x-expires" in body["reason"]


def test_load_definitions_at_boot(tmp_path):
    from .conftest import LocalBroker

    definitions = tmp_path / "defs.json"
    definitions.write_text(json.dumps({
        "users": [{"name": "booted", "password_hash": rabbit_password_hash("boot-pw"),
                   "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": ["management"]}],
        "vhosts": [{"name": "bootv"}],
        "permissions": [{"user": "booted", "vhost": "bootv", **FULL}],
        "queues": [{"name": "bootq", "vhost": "bootv", "durable": True, "auto_delete": False,
                    "arguments": {}}],
    }))
    config = tmp_path / "lavinpy.yaml"
    config.write_text(f"load_definitions: {definitions}\n")
    b = LocalBroker(tmp_path / "broker")
    b.extra_args = ["--config", str(config)]
    b.start()
    try:
        conn = _amqp(b, "booted", "boot-pw", "bootv")
        conn.channel().queue_declare("bootq", passive=True)
        conn.close()
        b.restart()  # applied again at the next boot: existing objects are kept
        _amqp(b, "booted", "boot-pw", "bootv").close()
    finally:
        b.close()
    # A bad file stops the start with an error naming the object.
    definitions.write_text(json.dumps({"queues": [{"name": "q", "vhost": "missing-vhost"}]}))
    b2 = LocalBroker(tmp_path / "broker2")
    b2.extra_args = ["--config", str(config)]
    with pytest.raises(pytest.fail.Exception):
        b2.start()
    assert "missing-vhost" in b2.log
