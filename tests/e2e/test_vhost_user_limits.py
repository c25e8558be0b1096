"""Vhost limits, user limits, operator policies, runtime and global parameters (real HTTP, real AMQP)."""

from __future__ import annotations

import re
import uuid

import pika
import pika.exceptions
import pytest

from .conftest import http_call, lavinpy_only

pytestmark = lavinpy_only("limits of a lavinpy started by the tests")

FULL = {"configure": ".*", "write": ".*", "read": ".*"}


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _ok(status: int) -> None:
    assert status in (201, 204), status


def _vhost(broker) -> str:
    name = _name("lv")
    _ok(http_call(broker, "PUT", f"/api/vhosts/{name}")[0])
    _ok(http_call(broker, "PUT", f"/api/permissions/{name}/guest", FULL)[0])
    return name


def _user(broker, vhost: str) -> str:
    name = _name("lu")
    _ok(http_call(broker, "PUT", f"/api/users/{name}", {"password": "pw", "tags": ""})[0])
    _ok(http_call(broker, "PUT", f"/api/permissions/{vhost}/{name}", FULL)[0])
    return name


def _connect(broker, user: str = "guest", password: str = "guest", vhost: str = "/") -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(broker.url_for(user, password, vhost)))


def _refused(broker, **kwargs) -> tuple[int, str]:
    """The reply code and text of a refused connection.open (pika wraps them in its access error)."""
    with pytest.raises(pika.exceptions.AMQPConnectionError) as caught:
        _connect(broker, **kwargs).close()
    found = re.search(r'\((\d+)\) "(.*)"', str(caught.value))
    assert found, str(caught.value)
    return int(found.group(1)), found.group(2)


def test_vhost_max_connections(broker):
    vhost = _vhost(broker)
    _ok(http_call(broker, "PUT", f"/api/vhost-limits/{vhost}/max-connections", {"value": 1})[0])
    assert http_call(broker, "GET", f"/api/vhost-limits/{vhost}")[1] == [
        {"vhost": vhost, "value": {"max-connections": 1}}]
    first = _connect(broker, vhost=vhost)
    assert _refused(broker, vhost=vhost) == (
        530, f"NOT_ALLOWED - access to vhost '{vhost}' refused for user 'guest': connection limit (1) is reached")
    _connect(broker).close()  # other vhosts are not affected
    assert first.is_open
    first.close()
    _connect(broker, vhost=vhost).close()  # the closed connection freed its place
    _ok(http_call(broker, "PUT", f"/api/vhost-limits/{vhost}/max-connections", {"value": 0})[0])
    assert _refused(broker, vhost=vhost)[0] == 530
    _ok(http_call(broker, "DELETE", f"/api/vhost-limits/{vhost}/max-connections")[0])
    _connect(broker, vhost=vhost).close()
    assert http_call(broker, "GET", f"/api/vhost-limits/{vhost}")[1] == []


def test_connection_limits_are_checked_before_vhost_access(broker):
    vhost = _vhost(broker)
    outsider = _user(broker, "%2F")  # no permission on vhost
    _ok(http_call(broker, "PUT", f"/api/vhost-limits/{vhost}/max-connections", {"value": 0})[0])
    assert _refused(broker, user=outsider, password="pw", vhost=vhost) == (
        530, f"NOT_ALLOWED - access to vhost '{vhost}' refused for user '{outsider}': "
             "connection limit (0) is reached")
    _ok(http_call(broker, "DELETE", f"/api/vhost-limits/{vhost}/max-connections")[0])
    assert _refused(broker, user=outsider, password="pw", vhost=vhost) == (
        530, f"NOT_ALLOWED - access to vhost '{vhost}' refused for user '{outsider}'")
    _connect(broker, vhost=vhost).close()  # the refusals were not counted against the vhost


def test_vhost_max_queues(broker):
    vhost = _vhost(broker)
    _ok(http_call(broker, "PUT", f"/api/vhost-limits/{vhost}/max-queues", {"value": 1})[0])
    conn = _connect(broker, vhost=vhost)
    ch = conn.channel()
    ch.queue_declare("q1")
    ch.queue_declare("q1")  # redeclaring an existing queue is no new queue
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
        ch.queue_declare("q2")
    assert (caught.value.reply_code, caught.value.reply_text) == (
        406, f"PRECONDITION_FAILED - cannot declare queue 'q2': queue limit in vhost '{vhost}' (1) is reached")
    assert conn.is_open  # only the channel closed
    ch = conn.channel()
    ch.queue_delete("q1")
    ch.queue_declare("q2")
    conn.close()


def test_user_limits(broker):
    vhost = _vhost(broker)
    user = _user(broker, vhost)
    _ok(http_call(broker, "PUT", f"/api/user-limits/{user}/max-connections", {"value": 1})[0])
    _ok(http_call(broker, "PUT", f"/api/user-limits/{user}/max-channels", {"value": 2})[0])
    assert http_call(broker, "GET", f"/api/user-limits/{user}")[1] == [
        {"user": user, "value": {"max-connections": 1, "max-channels": 2}}]
    conn = _connect(broker, user, "pw", vhost)
    assert _refused(broker, user=user, password="pw", vhost=vhost) == (
        530, f"NOT_ALLOWED - Connection refused for user '{user}': user connection limit (1) is reached")
    conn.channel()
    conn.channel()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as caught:
        conn.channel()
    assert (caught.value.reply_code, caught.value.reply_text) == (
        530, f"NOT_ALLOWED - number of channels opened for user '{user}' has reached "
             "the maximum allowed user limit of (2)")
    _connect(broker, vhost=vhost).close()  # guest is not limited
    conn2 = _connect(broker, user, "pw", vhost)  # the closed connection's place and channels are free
    conn2.channel()
    conn2.channel()
    conn2.close()
    _ok(http_call(broker, "DELETE", f"/api/user-limits/{user}/max-connections")[0])
    assert http_call(broker, "GET", f"/api/user-limits/{user}")[1] == [{"user": user, "value": {"max-channels": 2}}]


def test_malformed_limits_are_400_naming_the_key(broker):
    vhost = _vhost(broker)
    status, body, _ = http_call(broker, "PUT", f"/api/vhost-limits/{vhost}/max-connections", {"value": "x"})
    assert status == 400 and "max-connections" in body["reason"]
    status, body, _ = http_call(broker, "PUT", f"/api/vhost-limits/{vhost}/max-bananas", {"value": 1})
    assert status == 400 and "max-bananas" in body["reason"]
    status, body, _ = http_call(broker, "PUT", "/api/user-limits/guest/max-channels", {"value": 1.5})
    assert status == 400 and "max-channels" in body["reason"]
    status, body, _ = http_call(broker, "PUT", f"/api/parameters/vhost-limits/{vhost}/limits",
                                {"value": {"max-queues": True}})
    assert status == 400 and "max-queues" in body["reason"]
    status, body, _ = http_call(broker, "PUT", f"/api/parameters/mqtt-port-to-vhost-mapping/{vhost}/m",
                                {"value": {"1883": "/"}})
    assert status == 404 and "mqtt-port-to-vhost-mapping" in body["reason"]
    status, body, _ = http_call(broker, "PUT", "/api/vhost-limits/no-such-vhost/max-queues", {"value": 1})
    assert status == 404
    assert http_call(broker, "GET", f"/api/vhost-limits/{vhost}")[1] == []


def test_parameters_api_goes_through_the_registry(broker):
    vhost = _vhost(broker)
    _ok(http_call(broker, "PUT", f"/api/parameters/vhost-limits/{vhost}/limits",
                  {"vhost": vhost, "component": "vhost-limits", "name": "limits",
                   "value": {"max-queues": 5}})[0])
    item = {"name": "limits", "vhost": vhost, "component": "vhost-limits", "value": {"max-queues": 5}}
    assert item in http_call(broker, "GET", "/api/parameters")[1]
    assert http_call(broker, "GET", f"/api/parameters/vhost-limits/{vhost}")[1] == [item]
    assert http_call(broker, "GET", f"/api/parameters/vhost-limits/{vhost}/limits")[1] == item
    assert http_call(broker, "GET", f"/api/vhost-limits/{vhost}")[1] == [{"vhost": vhost, "value": {"max-queues": 5}}]
    _ok(http_call(broker, "DELETE", f"/api/parameters/vhost-limits/{vhost}/limits")[0])
    assert http_call(broker, "GET", f"/api/parameters/vhost-limits/{vhost}/limits")[0] == 404


def test_operator_policy_stricter_value_wins(broker):
    vhost = _vhost(broker)
    _ok(http_call(broker, "PUT", f"/api/policies/{vhost}/p", {"pattern": "^op", "definition": {"max-length": 5}})[0])
    _ok(http_call(broker, "PUT", f"/api/operator-policies/{vhost}/cap",
                  {"pattern": "^op", "definition": {"max-length": 2, "message-ttl": 60000},
                   "apply-to": "queues"})[0])
    conn = _connect(broker, vhost=vhost)
    ch = conn.channel()
    ch.queue_declare("op-q")
    for i in range(4):
        ch.basic_publish("", "op-q", str(i).encode())
    conn.close()
    status, queue, _ = http_call(broker, "GET", f"/api/queues/{vhost}/op-q")
    assert status == 200
    assert queue["policy"] == "p" and queue["operator_policy"] == "cap"
    assert queue["effective_policy_definition"] == {"max-length": 2, "message-ttl": 60000}
    assert queue["messages"] == 2
    status, body, _ = http_call(broker, "PUT", f"/api/operator-policies/{vhost}/bad",
                                {"pattern": ".*", "definition": {"dead-letter-exchange": "x"}})
    assert status == 400 and "dead-letter-exchange" in body["reason"]
    listed = http_call(broker, "GET", f"/api/operator-policies/{vhost}")[1]
    assert [(p["name"], p["definition"]) for p in listed] == [("cap", {"max-length": 2, "message-ttl": 60000})]
    _ok(http_call(broker, "DELETE", f"/api/operator-policies/{vhost}/cap")[0])
    assert http_call(broker, "GET", f"/api/queues/{vhost}/op-q")[1]["operator_policy"] == ""


def test_global_parameters_and_cluster_name(fresh_broker):
    b = fresh_broker
    _ok(http_call(b, "PUT", "/api/global-parameters/cluster_name", {"name": "cluster_name", "value": "blue"})[0])
    _ok(http_call(b, "PUT", "/api/global-parameters/internal_cluster_id", {"value": "rabbitmq-cluster-id-x"})[0])
    assert http_call(b, "GET", "/api/overview")[1]["cluster_name"] == "blue"
    assert http_call(b, "GET", "/api/global-parameters/cluster_name")[1] == {"name": "cluster_name", "value": "blue"}
    status, body, _ = http_call(b, "PUT", "/api/global-parameters/cluster_name", {"value": 3})
    assert status == 400 and "cluster_name" in body["reason"]


def test_limits_persist_across_restart(fresh_broker):
    b = fresh_broker
    vhost = _vhost(b)
    user = _user(b, vhost)
    _ok(http_call(b, "PUT", f"/api/vhost-limits/{vhost}/max-queues", {"value": 0})[0])
    _ok(http_call(b, "PUT", f"/api/user-limits/{user}/max-connections", {"value": 0})[0])
    _ok(http_call(b, "PUT", f"/api/operator-policies/{vhost}/cap",
                  {"pattern": ".*", "definition": {"expires": 9000}})[0])
    _ok(http_call(b, "PUT", "/api/global-parameters/cluster_name", {"value": "green"})[0])
    b.restart()
    assert http_call(b, "GET", f"/api/vhost-limits/{vhost}")[1] == [{"vhost": vhost, "value": {"max-queues": 0}}]
    assert http_call(b, "GET", f"/api/user-limits/{user}")[1] == [{"user": user, "value": {"max-connections": 0}}]
    assert [p["name"] for p in http_call(b, "GET", f"/api/operator-policies/{vhost}")[1]] == ["cap"]
    assert http_call(b, "GET", "/api/overview")[1]["cluster_name"] == "green"
    assert _refused(b, user=user, password="pw", vhost=vhost)[0] == 530
    conn = _connect(b, vhost=vhost)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
        conn.channel().queue_declare("any")
    assert caught.value.reply_code == 406
    conn.close()
    # deleting the vhost and the user takes their limits with them
    _ok(http_call(b, "DELETE", f"/api/vhosts/{vhost}")[0])
    _ok(http_call(b, "DELETE", f"/api/users/{user}")[0])
    assert http_call(b, "GET", "/api/vhost-limits")[1] == []
    assert http_call(b, "GET", "/api/user-limits")[1] == []


def _definitions(vhost: str, user: str) -> dict:
    return {
        "users": [{"name": user, "password_hash": "", "hashing_algorithm": "rabbit_password_hashing_sha256",
                   "tags": [], "limits": {"max-connections": 2}}],
        "vhosts": [{"name": vhost, "limits": [], "metadata": {"description": "", "tags": []}}],
        "permissions": [{"user": user, "vhost": vhost, **FULL}],
        "parameters": [
            {"vhost": vhost, "component": "vhost-limits", "name": "limits", "value": {"max-queues": 2}},
            {"vhost": vhost, "component": "operator_policy", "name": "cap",
             "value": {"pattern": ".*", "definition": {"message-ttl": 1000}, "priority": 0, "apply-to": "queues"}},
        ],
        "global_parameters": [{"name": "cluster_name", "value": "imported"},
                              {"name": "internal_cluster_id", "value": "rabbitmq-cluster-id-abc"}],
        "queues": [{"name": "dq", "vhost": vhost, "durable": True, "auto_delete": False, "arguments": {}}],
    }


def test_definitions_round_trip(fresh_broker):
    b = fresh_broker
    vhost, user = _name("dv"), _name("du")
    _ok(http_call(b, "POST", "/api/definitions", _definitions(vhost, user))[0])
    assert http_call(b, "GET", f"/api/vhost-limits/{vhost}")[1] == [{"vhost": vhost, "value": {"max-queues": 2}}]
    assert http_call(b, "GET", f"/api/user-limits/{user}")[1] == [{"user": user, "value": {"max-connections": 2}}]
    assert http_call(b, "GET", f"/api/queues/{vhost}/dq")[1]["effective_policy_definition"] == {"message-ttl": 1000}
    assert http_call(b, "GET", "/api/overview")[1]["cluster_name"] == "imported"
    exported = http_call(b, "GET", "/api/definitions")[1]
    assert {"vhost": vhost, "component": "vhost-limits", "name": "limits",
            "value": {"max-queues": 2}} in exported["parameters"]
    assert [p["value"]["definition"] for p in exported["parameters"]
            if p["component"] == "operator_policy" and p["vhost"] == vhost] == [{"message-ttl": 1000}]
    assert exported["global_parameters"] == [{"name": "cluster_name", "value": "imported"}]
    assert next(u for u in exported["users"] if u["name"] == user)["limits"] == {"max-connections": 2}
    # the export imports again unchanged
    status, body, _ = http_call(b, "POST", "/api/definitions", exported)
    assert status in (201, 204), body
    assert http_call(b, "GET", "/api/definitions")[1]["parameters"] == exported["parameters"]


def test_definitions_bad_items_refused_by_name_nothing_applied(fresh_broker):
    b = fresh_broker
    vhost, user = _name("dv"), _name("du")
    doc = _definitions(vhost, user)
    doc["parameters"].append({"vhost": vhost, "component": "mqtt-port-to-vhost-mapping", "name": "up",
                              "value": {"1883": "/"}})
    status, body, _ = http_call(b, "POST", "/api/definitions", doc)
    assert status == 400 and "mqtt-port-to-vhost-mapping" in body["reason"] and "'up'" in body["reason"]
    assert http_call(b, "GET", f"/api/vhosts/{vhost}")[0] == 404  # nothing applied
    doc = _definitions(vhost, user)
    doc["parameters"][0]["value"] = {"max-queues": "two"}
    status, body, _ = http_call(b, "POST", "/api/definitions", doc)
    assert status == 400 and "max-queues" in body["reason"]
    doc = _definitions(vhost, user)
    doc["parameters"][0]["value"] = {"max-queues": 0}
    status, body, _ = http_call(b, "POST", "/api/definitions", doc)
    assert status == 400
    assert f'Adding 1 queue(s) to virtual host "{vhost}" would exceed the limit of 0' in body["reason"]
    doc = _definitions(vhost, user)
    doc["users"][0]["limits"] = {"max-sessions": 1}
    status, body, _ = http_call(b, "POST", "/api/definitions", doc)
    assert status == 400 and "max-sessions" in body["reason"]
    assert http_call(b, "GET", f"/api/vhosts/{vhost}")[0] == 404
