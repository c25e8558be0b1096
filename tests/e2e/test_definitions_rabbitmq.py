"""A RabbitMQ 3.10 export imports into lavinpy whole (users with passwords, vhost metadata, topic
permissions, an ha-mode policy, queues, exchanges, bindings): every item applied or reported as not
needed, users log in over AMQP and their topic permissions are enforced; lavinpy's export (topic
permissions and the ha-* keys included) imports back into RabbitMQ. Bad items refuse the import whole."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pika
import pytest

from . import channel_closed
from .conftest import http_call, lavinpy_only
from .rabbitmq_node import RabbitNode
from .rabbitmq_node import needs_rabbitmq as rabbitmq_installed
from .test_rabbitmq_interop import _ok

pytestmark = [pytest.mark.timeout(180), lavinpy_only("imports into a lavinpy started by the tests")]
needs_rabbitmq = [pytest.mark.slow, rabbitmq_installed]

FULL = {"configure": ".*", "write": ".*", "read": ".*"}
HA = {"ha-mode": "all", "ha-sync-mode": "automatic", "ha-promote-on-shutdown": "always", "queue-mode": "lazy",
      "queue-master-locator": "min-masters", "max-length": 10}


def _populate(node: RabbitNode) -> None:
    _ok(node, "PUT", "/api/vhosts/mv", {"description": "orders", "tags": "prod,eu"})
    _ok(node, "PUT", "/api/users/carol", {"password": "carol-pw", "tags": "management"})
    _ok(node, "PUT", "/api/users/dave", {"password": "dave-pw", "tags": ""})
    for user in ("carol", "dave"):
        _ok(node, "PUT", f"/api/permissions/mv/{user}", FULL)
    _ok(node, "PUT", "/api/topic-permissions/mv/carol", {"exchange": "amq.topic", "write": "^{username}\\.",
                                                         "read": "^pub\\."})
    _ok(node, "PUT", "/api/topic-permissions/mv/dave", {"exchange": "events", "write": "^ev\\.", "read": ".*"})
    _ok(node, "PUT", "/api/policies/mv/mirrored", {"pattern": "^ha\\.", "apply-to": "queues", "definition": HA})
    _ok(node, "PUT", "/api/exchanges/mv/events", {"type": "topic", "durable": True})
    _ok(node, "PUT", "/api/queues/mv/ha.work", {"durable": True, "arguments": {}})
    _ok(node, "PUT", "/api/queues/mv/plain", {"durable": True, "arguments": {"x-message-ttl": 5000}})
    _ok(node, "PUT", "/api/queues/mv/qq", {"durable": True, "arguments": {"x-queue-type": "quorum"}})
    _ok(node, "POST", "/api/bindings/mv/e/events/q/ha.work", {"routing_key": "ev.#"})
    # A dynamic shovel (RabbitMQ's shovel plugin): in the export as a parameter, run by lavinpy after the import.
    _ok(node, "PUT", "/api/parameters/shovel/mv/move-plain",
        {"value": {"src-protocol": "amqp091", "src-uri": "amqp://", "src-queue": "plain",
                   "dest-protocol": "amqp091", "dest-uri": "amqp://", "dest-queue": "moved",
                   "ack-mode": "on-confirm", "src-delete-after": "never"}})


def _amqp(broker, user: str, password: str, vhost: str = "mv") -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(broker.url_for(user, password, vhost)))


def _check_enforced(broker) -> None:
    conn = _amqp(broker, "carol", "carol-pw")
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("amq.topic", "carol.x", b"allowed")
        # RabbitMQ 4 (and lavinpy) begin the text with the kind, "write access ..."; 3.10 with "access".
        with channel_closed(403, "access to topic 'dave.x' in exchange 'amq.topic' in vhost 'mv' "
                                 "refused for user 'carol'"):
            ch.basic_publish("amq.topic", "dave.x", b"refused")
            ch.basic_qos(prefetch_count=0)
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        with channel_closed(403, "access to topic 'priv.x' in exchange 'amq.topic' in vhost 'mv' "
                                 "refused for user 'carol'"):
            ch.queue_bind(q, "amq.topic", "priv.x")
    finally:
        conn.close()
    conn = _amqp(broker, "dave", "dave-pw")
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_purge("ha.work")
        ch.basic_publish("events", "ev.new", b"routed")
        assert ch.queue_declare("ha.work", passive=True).method.message_count == 1
        with channel_closed(403, "access to topic 'other' in exchange 'events'"):
            ch.basic_publish("events", "other", b"refused")
            ch.basic_qos(prefetch_count=0)
    finally:
        conn.close()


@needs_rabbitmq[0]
@needs_rabbitmq[1]
def test_rabbitmq_export_imports_whole_and_back(rabbit: RabbitNode, fresh_broker) -> None:
    _populate(rabbit)
    status, exported, _ = http_call(rabbit, "GET", "/api/definitions")
    assert status == 200
    # RabbitMQ 3.10 exports a vhost's name only; 3.11 and later add its metadata, as here.
    for vhost in exported["vhosts"]:
        if vhost["name"] == "mv":
            vhost["metadata"] = {"description": "orders", "tags": ["prod", "eu"], "default_queue_type": "classic"}
    assert exported["topic_permissions"] and exported["policies"][0]["definition"]["ha-mode"] == "all"

    # A dry run reports the same and applies nothing.
    status, reply, _ = http_call(fresh_broker, "POST", "/api/definitions?dry_run=true", exported)
    assert status == 200 and reply["dry_run"] is True, reply
    assert http_call(fresh_broker, "GET", "/api/vhosts/mv")[0] == 404
    status, reply, _ = http_call(fresh_broker, "POST", "/api/definitions", exported)
    assert status == 200, reply
    ignored = {(i["type"], i["name"], i["key"]) for i in reply["ignored"]}
    assert ignored == {("policy", "mirrored", k) for k in
                       ("ha-mode", "ha-sync-mode", "ha-promote-on-shutdown", "queue-mode", "queue-master-locator")}

    vhost = http_call(fresh_broker, "GET", "/api/vhosts/mv")[1]
    assert vhost["description"] == "orders" and vhost["tags"] == ["prod", "eu"]
    assert vhost["default_queue_type"] == "classic"
    policy = http_call(fresh_broker, "GET", "/api/policies/mv/mirrored")[1]
    assert policy["definition"] == HA and "ha-mode" in policy["not_needed"]
    assert len(http_call(fresh_broker, "GET", "/api/topic-permissions")[1]) == 2
    _check_enforced(fresh_broker)
    assert http_call(fresh_broker, "GET", "/api/queues/mv/qq")[1]["type"] == "quorum"
    # The shovel from RabbitMQ's export runs here, on lavinpy's own queues ("amqp://" is this node).
    assert [p["name"] for p in exported["parameters"] if p["component"] == "shovel"] == ["move-plain"]
    assert http_call(fresh_broker, "GET", "/api/parameters/shovel/mv/move-plain")[0] == 200
    deadline = time.monotonic() + 20
    while not [s for s in http_call(fresh_broker, "GET", "/api/shovels/mv")[1] if s["state"] == "running"]:
        assert time.monotonic() < deadline, http_call(fresh_broker, "GET", "/api/shovels/mv")[1]
        time.sleep(0.1)

    # lavinpy's export goes back into RabbitMQ 3.10 (after the vhost and users there are gone).
    status, ours, _ = http_call(fresh_broker, "GET", "/api/definitions")
    assert status == 200
    _ok(rabbit, "DELETE", "/api/vhosts/mv")
    for user in ("carol", "dave"):
        _ok(rabbit, "DELETE", f"/api/users/{user}")
    status, reply, _ = http_call(rabbit, "POST", "/api/definitions", ours)
    assert status in (200, 201, 204), reply
    back = http_call(rabbit, "GET", "/api/definitions")[1]
    assert sorted((t["user"], t["exchange"], t["write"], t["read"]) for t in back["topic_permissions"]) == [
        ("carol", "amq.topic", "^{username}\\.", "^pub\\."), ("dave", "events", "^ev\\.", ".*")]
    (mirrored,) = [p for p in back["policies"] if p["name"] == "mirrored"]
    assert mirrored["definition"] == HA
    assert http_call(rabbit, "GET", "/api/vhosts/mv")[1]["description"] == "orders"
    assert [p["name"] for p in back["parameters"] if p["component"] == "shovel"] == ["move-plain"]
    _check_enforced(rabbit)


def test_policy_put_with_rabbitmq_only_keys(fresh_broker) -> None:
    status, reply, _ = http_call(fresh_broker, "PUT", "/api/policies/%2F/ha",
                                 {"pattern": ".*", "definition": HA, "apply-to": "queues"})
    assert status == 201, reply
    policy = http_call(fresh_broker, "GET", "/api/policies/%2F/ha")[1]
    assert policy["definition"] == HA
    assert policy["not_needed"] == ["ha-mode", "ha-promote-on-shutdown", "ha-sync-mode", "queue-master-locator"]


def test_import_with_bad_items_names_each_and_applies_nothing(fresh_broker) -> None:
    doc = {"vhosts": [{"name": "nv"}],
           "users": [{"name": "eve", "password_hash": "abc", "hashing_algorithm": "md4", "tags": ""}],
           "topic_permissions": [{"user": "nobody", "vhost": "nv", "exchange": "amq.topic", "write": ".*",
                                  "read": ".*"}]}
    status, reply, _ = http_call(fresh_broker, "POST", "/api/definitions", doc)
    assert status == 400 and "md4" in reply["reason"], reply
    assert http_call(fresh_broker, "GET", "/api/vhosts/nv")[0] == 404
    assert http_call(fresh_broker, "GET", "/api/users/eve")[0] == 404


def test_lavinmq_export_imports_and_its_users_log_in(fresh_broker) -> None:
    """LavinMQ's export: its algorithm spellings, the bcrypt hashes it makes, its version key."""
    bcrypt = pytest.importorskip("bcrypt")
    import base64
    import hashlib
    salt = b"\x01\x02\x03\x04"
    sha512 = base64.b64encode(salt + hashlib.sha512(salt + b"pw-s").digest()).decode()
    doc = {"lavinmq_version": "2.9.0",
           "users": [{"name": "lb", "hashing_algorithm": "lavinmq_bcrypt", "tags": "",
                      "password_hash": bcrypt.hashpw(b"pw-b", bcrypt.gensalt(4, prefix=b"2a")).decode()},
                     {"name": "ls", "hashing_algorithm": "SHA512", "tags": "", "password_hash": "$6$" + sha512}],
           "vhosts": [{"name": "lv"}],
           "permissions": [{"user": u, "vhost": "lv", **FULL} for u in ("lb", "ls")],
           "exchanges": [{"name": "dx", "vhost": "lv", "type": "x-delayed-message", "durable": True,
                          "auto_delete": False, "internal": False, "arguments": {"x-delayed-type": "direct"}}]}
    status, reply, _ = http_call(fresh_broker, "POST", "/api/definitions", doc)
    assert status == 204, reply
    for user, password in (("lb", "pw-b"), ("ls", "pw-s")):
        _amqp(fresh_broker, user, password, "lv").close()
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        _amqp(fresh_broker, "lb", "wrong", "lv")
    exported = {u["name"]: u for u in http_call(fresh_broker, "GET", "/api/definitions")[1]["users"]}
    assert exported["ls"]["hashing_algorithm"] == "rabbit_password_hashing_sha512"
    # A bcrypt user is rehashed to RabbitMQ's SHA-256 form by its first good login (rehash_bcrypt_on_login).
    assert exported["lb"]["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    _amqp(fresh_broker, "lb", "pw-b", "lv").close()


def test_quorum_queue_in_an_export_goes_to_the_declare_rules(fresh_broker) -> None:
    """The import passes a quorum queue to the model's declare rules (it refuses it only if they do)."""
    doc = {"queues": [{"name": "qq", "vhost": "/", "durable": True, "auto_delete": False,
                       "arguments": {"x-queue-type": "quorum"}}]}
    status, reply, _ = http_call(fresh_broker, "POST", "/api/definitions?dry_run=true", doc)
    if status == 400 and "not supported" in reply["reason"]:
        pytest.skip("this build has no quorum queue type yet")
    assert status == 200, reply
    status, reply, _ = http_call(fresh_broker, "POST", "/api/definitions", doc)
    assert status in (200, 204), reply
    queue = http_call(fresh_broker, "GET", "/api/queues/%2F/qq")[1]
    assert queue["type"] == "quorum"
    bad = {"queues": [{"name": "qq2", "vhost": "/", "durable": False, "auto_delete": False,
                       "arguments": {"x-queue-type": "quorum"}}]}
    status, reply, _ = http_call(fresh_broker, "POST", "/api/definitions", bad)
    assert status == 400 and "qq2" in reply["reason"], reply


@pytest.mark.skipif(shutil.which("rabbitmqadmin") is None, reason="rabbitmqadmin is not installed")
def test_rabbitmqadmin_imports_and_declares_ha_policies(fresh_broker, tmp_path: Path) -> None:
    """Debian's rabbitmqadmin: `import` of an export with ha-* keys and `declare policy` with them."""
    b = fresh_broker

    def admin(*args: str) -> str:
        cmd = ["rabbitmqadmin", "-H", b.host, "-P", str(b.http_port), "-u", "guest", "-p", "guest", *args]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"{' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout

    path = tmp_path / "defs.json"
    path.write_text(json.dumps({"policies": [{"vhost": "/", "name": "m", "pattern": "^m", "apply-to": "queues",
                                              "priority": 0, "definition": HA}],
                                "topic_permissions": [{"user": "guest", "vhost": "/", "exchange": "amq.topic",
                                                       "write": ".*", "read": ".*"}]}))
    admin("import", str(path))
    admin("declare", "policy", "name=m2", "pattern=^n",
          "definition=" + json.dumps({"ha-mode": "exactly", "ha-params": 2}))
    policies = {p["name"]: p for p in json.loads(admin("-f", "raw_json", "list", "policies"))}
    assert policies["m"]["definition"] == HA
    assert policies["m2"]["definition"] == {"ha-mode": "exactly", "ha-params": 2}
    assert http_call(b, "GET", "/api/topic-permissions/%2F/guest")[1][0]["exchange"] == "amq.topic"
