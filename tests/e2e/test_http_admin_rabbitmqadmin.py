"""Debian's rabbitmqadmin against lavinpy: users, vhosts, permissions, policies, export/import."""

from __future__ import annotations

import json
import shutil
import subprocess

import pika
import pytest

from .conftest import http_call, lavinpy_only

RABBITMQADMIN = shutil.which("rabbitmqadmin")
pytestmark = [lavinpy_only("management API of a lavinpy started by the tests"),
              pytest.mark.skipif(RABBITMQADMIN is None, reason="rabbitmqadmin is not installed")]


def admin(broker, *args: str) -> str:
    cmd = [RABBITMQADMIN, "-H", broker.host, "-P", str(broker.http_port), "-u", "guest", "-p", "guest", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout


def listed(broker, what: str, *args: str) -> list[dict]:
    return json.loads(admin(broker, "-f", "raw_json", "list", what, *args))


def test_users_vhosts_permissions_policies(fresh_broker):
    b = fresh_broker
    admin(b, "declare", "vhost", "name=rv")
    assert "rv" in {v["name"] for v in listed(b, "vhosts")}
    admin(b, "declare", "user", "name=ru", "password=ru-pw", "tags=management")
    users = {u["name"]: u for u in listed(b, "users")}
    assert users["ru"]["tags"] in (["management"], "management")
    admin(b, "declare", "permission", "vhost=rv", "user=ru", "configure=.*", "write=.*", "read=.*")
    assert {"user": "ru", "vhost": "rv", "configure": ".*", "write": ".*", "read": ".*"} in listed(b, "permissions")
    pika.BlockingConnection(pika.URLParameters(b.url_for("ru", "ru-pw", "rv"))).close()
    admin(b, "-V", "rv", "declare", "policy", "name=rp", "pattern=^q", 'definition={"max-length": 4}',
          "apply-to=queues", "priority=2")
    policies = listed(b, "policies")
    assert {(p["vhost"], p["name"], p["pattern"], p["priority"]) for p in policies} == {("rv", "rp", "^q", 2)}
    assert policies[0]["definition"] == {"max-length": 4}
    admin(b, "-V", "rv", "delete", "policy", "name=rp")
    assert listed(b, "policies") == []
    admin(b, "delete", "permission", "vhost=rv", "user=ru")
    assert [p for p in listed(b, "permissions") if p["user"] == "ru"] == []
    admin(b, "delete", "user", "name=ru")
    assert "ru" not in {u["name"] for u in listed(b, "users")}
    admin(b, "delete", "vhost", "name=rv")
    assert "rv" not in {v["name"] for v in listed(b, "vhosts")}


def test_export_and_import_files(fresh_broker, tmp_path):
    b = fresh_broker
    admin(b, "declare", "vhost", "name=ev")
    admin(b, "declare", "user", "name=eu", "password=eu-pw", "tags=")
    admin(b, "declare", "permission", "vhost=ev", "user=eu", "configure=.*", "write=.*", "read=.*")
    admin(b, "-V", "ev", "declare", "policy", "name=ep", "pattern=.*", 'definition={"message-ttl": 1000}')
    conn = pika.BlockingConnection(pika.URLParameters(b.url_for("eu", "eu-pw", "ev")))
    ch = conn.channel()
    ch.exchange_declare("ex", "topic", durable=True)
    ch.queue_declare("eq", durable=True)
    ch.queue_bind("eq", "ex", "k.*")
    conn.close()
    path = tmp_path / "defs.json"
    admin(b, "export", str(path))
    exported = json.loads(path.read_text())
    assert {q["name"] for q in exported["queues"]} == {"eq"}
    assert http_call(b, "DELETE", "/api/vhosts/ev")[0] == 204
    assert http_call(b, "DELETE", "/api/users/eu")[0] == 204
    admin(b, "import", str(path))
    conn = pika.BlockingConnection(pika.URLParameters(b.url_for("eu", "eu-pw", "ev")))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("ex", "k.1", b"x")
    assert ch.queue_declare("eq", passive=True).method.message_count == 1
    conn.close()
    assert http_call(b, "GET", "/api/policies/ev/ep")[1]["definition"] == {"message-ttl": 1000}
