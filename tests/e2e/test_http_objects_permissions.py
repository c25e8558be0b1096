"""The object endpoints under RabbitMQ's tag and vhost-permission rules (real HTTP, real broker)."""

from __future__ import annotations

from .conftest import http_call, make_admin


def _setup(broker):
    admin = make_admin(broker)
    admin.add_vhost("minevh")
    admin.add_vhost("othervh")
    admin.add_user("mgr", "pw", ("management",))
    admin.set_permissions("mgr", "minevh", "^mine", "^mine", "^mine")
    admin.set_permissions("guest", "minevh", ".*", ".*", ".*")
    admin.set_permissions("guest", "othervh", ".*", ".*", ".*")
    admin.add_user("watcher", "pw", ("monitoring",))
    admin.apply()


def _as(broker, method, path, body=None, user="mgr"):
    return http_call(broker, method, path, body, user=user, password="pw")


def test_management_user_touches_only_permitted_objects(fresh_broker):
    _setup(fresh_broker)
    b = fresh_broker
    assert _as(b, "PUT", "/api/queues/minevh/mine-q", {"durable": False})[0] == 201
    status, body, _ = _as(b, "PUT", "/api/queues/minevh/theirs-q", {"durable": False})
    assert status == 401
    assert body["reason"] == "configure access to queue 'theirs-q' in vhost 'minevh' refused for user 'mgr'"
    assert _as(b, "PUT", "/api/exchanges/minevh/mine-x", {"type": "fanout"})[0] == 201
    assert _as(b, "PUT", "/api/exchanges/minevh/other-x", {"type": "fanout"})[0] == 401
    # a dead-letter exchange named in arguments needs write permission on it
    status, body, _ = _as(b, "PUT", "/api/queues/minevh/mine-dl", {"arguments": {"x-dead-letter-exchange": "dlx"}})
    assert status == 401 and "write access to exchange 'dlx'" in body["reason"]
    assert _as(b, "POST", "/api/bindings/minevh/e/mine-x/q/mine-q", {"routing_key": ""})[0] == 201
    assert _as(b, "POST", "/api/exchanges/minevh/mine-x/publish",
               {"properties": {}, "routing_key": "", "payload": "p", "payload_encoding": "string"})[1] == \
        {"routed": True}
    assert _as(b, "POST", "/api/exchanges/minevh/amq.default/publish",
               {"properties": {}, "routing_key": "x", "payload": "p", "payload_encoding": "string"})[0] == 401
    # guest (administrator) made a queue the manager may not read or delete
    assert http_call(b, "PUT", "/api/queues/minevh/theirs-q", {"durable": False})[0] == 201
    assert _as(b, "DELETE", "/api/queues/minevh/theirs-q/contents")[0] == 401
    assert _as(b, "POST", "/api/queues/minevh/theirs-q/get", {"count": 1, "ackmode": "ack_requeue_true"})[0] == 401
    assert _as(b, "GET", "/api/queues/minevh/theirs-q/peek?count=1")[0] == 401
    assert _as(b, "DELETE", "/api/queues/minevh/theirs-q")[0] == 401
    assert _as(b, "POST", "/api/queues/minevh/mine-q/get", {"count": 1, "ackmode": "ack_requeue_false"})[1][0][
        "payload"] == "p"
    assert _as(b, "DELETE", "/api/queues/minevh/mine-q")[0] == 204


def test_users_see_only_their_vhosts(fresh_broker):
    _setup(fresh_broker)
    b = fresh_broker
    assert http_call(b, "PUT", "/api/queues/othervh/secret", {"durable": False})[0] == 201
    assert http_call(b, "PUT", "/api/queues/minevh/mine-visible", {"durable": False})[0] == 201
    status, body, _ = _as(b, "GET", "/api/queues")
    assert status == 200 and {q["vhost"] for q in body} == {"minevh"}
    assert "mine-visible" in {q["name"] for q in body}
    assert {x["vhost"] for x in _as(b, "GET", "/api/exchanges")[1]} == {"minevh"}
    assert {x["vhost"] for x in _as(b, "GET", "/api/bindings")[1]} == {"minevh"}
    assert _as(b, "GET", "/api/queues/othervh")[0] == 401
    assert _as(b, "GET", "/api/queues/othervh/secret")[0] == 401
    assert _as(b, "PUT", "/api/queues/othervh/mine-q", {})[0] == 401
    # monitoring sees every vhost, as RabbitMQ, but may not act on one it has no permissions in
    status, body, _ = _as(b, "GET", "/api/queues", user="watcher")
    assert {"secret", "mine-visible"} <= {q["name"] for q in body}
    assert _as(b, "PUT", "/api/queues/othervh/watched", {}, user="watcher")[0] == 401

