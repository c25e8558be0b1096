"""Users, vhosts, permissions and policies through the management API (real HTTP, real AMQP)."""

from __future__ import annotations

import uuid
from urllib.parse import quote

import pika
import pika.exceptions
import pytest

from .conftest import http_call, lavinpy_only, rabbit_password_hash

pytestmark = lavinpy_only("management API of a lavinpy started by the tests")

FULL = {"configure": ".*", "write": ".*", "read": ".*"}


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _q(name: str) -> str:
    return quote(name, safe="")


def _amqp(broker, user: str, password: str, vhost: str = "/") -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(broker.url_for(user, password, vhost)))


def _login_fails(broker, user: str, password: str, vhost: str = "/") -> bool:
    try:
        _amqp(broker, user, password, vhost).close()
    except pika.exceptions.ProbableAuthenticationError:
        return True
    except pika.exceptions.AMQPConnectionError:
        return True
    return False


def _user(broker, name: str, password: str, tags: str = "", vhost: str | None = "/") -> None:
    assert http_call(broker, "PUT", f"/api/users/{_q(name)}", {"password": password, "tags": tags})[0] == 201
    if vhost is not None:
        assert http_call(broker, "PUT", f"/api/permissions/{_q(vhost)}/{_q(name)}", FULL)[0] == 201


def test_whoami(broker):
    status, body, _ = http_call(broker, "GET", "/api/whoami")
    assert status == 200
    assert body == {"name": "guest", "tags": ["administrator"]}


def test_user_put_get_delete_and_amqp_login(broker):
    name = _name("u")
    assert http_call(broker, "PUT", f"/api/users/{name}", {"password": "s3cret", "tags": "management"})[0] == 201
    status, body, _ = http_call(broker, "GET", f"/api/users/{name}")
    assert status == 200
    assert body["name"] == name and body["tags"] == ["management"]
    assert body["hashing_algorithm"] == "rabbit_password_hashing_sha256" and body["password_hash"]
    assert name in {u["name"] for u in http_call(broker, "GET", "/api/users")[1]}
    # Updating keeps the password when none is given, and takes tags as a list too.
    assert http_call(broker, "PUT", f"/api/users/{name}", {"tags": ["monitoring", "management"]})[0] == 204
    assert sorted(http_call(broker, "GET", f"/api/users/{name}")[1]["tags"]) == ["management", "monitoring"]
    assert http_call(broker, "PUT", f"/api/permissions/%2F/{name}", FULL)[0] == 201
    _amqp(broker, name, "s3cret").close()
    assert http_call(broker, "DELETE", f"/api/users/{name}")[0] == 204
    status, body, _ = http_call(broker, "GET", f"/api/users/{name}")
    assert status == 404 and body["error"] == "Object Not Found"
    assert http_call(broker, "DELETE", f"/api/users/{name}")[0] == 404
    assert _login_fails(broker, name, "s3cret")


@pytest.mark.parametrize("algorithm", ["rabbit_password_hashing_sha256", "rabbit_password_hashing_sha512"])
def test_user_from_password_hash_logs_in(broker, algorithm):
    import base64
    import hashlib
    import os

    name = _name("h")
    salt = os.urandom(4)
    digest = hashlib.new(algorithm.rsplit("_", 1)[1], salt + b"hashed-pw").digest()
    password_hash = base64.b64encode(salt + digest).decode()
    assert http_call(broker, "PUT", f"/api/users/{name}",
                     {"password_hash": password_hash, "hashing_algorithm": algorithm, "tags": ""})[0] == 201
    assert http_call(broker, "GET", f"/api/users/{name}")[1]["password_hash"] == password_hash
    assert http_call(broker, "PUT", f"/api/permissions/%2F/{name}", FULL)[0] == 201
    _amqp(broker, name, "hashed-pw").close()
    assert _login_fails(broker, name, "other")


def test_bad_user_bodies_are_400_naming_the_problem(broker):
    name = _name("bad")
    status, body, _ = http_call(broker, "PUT", f"/api/users/{name}",
                                {"password_hash": rabbit_password_hash("x"), "hashing_algorithm": "md4"})
    assert status == 400 and "hashing_algorithm" in body["reason"]
    status, body, _ = http_call(broker, "PUT", f"/api/users/{name}", {"password": "x", "tags": 5})
    assert status == 400 and "tags" in body["reason"]
    status, body, _ = http_call(broker, "PUT", f"/api/users/{name}", raw=b"{not json")
    assert status == 400 and "JSON" in body["reason"]
    assert http_call(broker, "GET", f"/api/users/{name}")[0] == 404


def test_password_change_applies_at_once_to_amqp_and_http(broker):
    name = _name("pw")
    _user(broker, name, "old-pw", "management")
    _amqp(broker, name, "old-pw").close()
    assert http_call(broker, "GET", "/api/whoami", user=name, password="old-pw")[0] == 200
    assert http_call(broker, "PUT", f"/api/users/{name}", {"password": "new-pw", "tags": "management"})[0] == 204
    assert _login_fails(broker, name, "old-pw")
    assert http_call(broker, "GET", "/api/whoami", user=name, password="old-pw")[0] == 401
    _amqp(broker, name, "new-pw").close()
    assert http_call(broker, "GET", "/api/whoami", user=name, password="new-pw")[0] == 200


def test_open_connection_sees_permission_removal_at_next_operation(broker):
    name = _name("perm")
    _user(broker, name, "pw")
    conn = _amqp(broker, name, "pw")
    try:
        ch = conn.channel()
        queue = _name("pq")
        ch.queue_declare(queue, auto_delete=True)
        assert http_call(broker, "DELETE", f"/api/permissions/%2F/{name}")[0] == 204
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
            ch.queue_declare(_name("pq2"), auto_delete=True)
        assert exc.value.reply_code == 403
        assert name in exc.value.reply_text
    finally:
        if conn.is_open:
            conn.close()


def test_permission_endpoints(broker):
    name = _name("pe")
    _user(broker, name, "pw", vhost=None)
    assert http_call(broker, "GET", f"/api/permissions/%2F/{name}")[0] == 404
    perms = {"configure": "^c", "write": "^w", "read": "^r"}
    assert http_call(broker, "PUT", f"/api/permissions/%2F/{name}", perms)[0] == 201
    assert http_call(broker, "PUT", f"/api/permissions/%2F/{name}", perms)[0] == 204
    expected = {"user": name, "vhost": "/", **perms}
    assert http_call(broker, "GET", f"/api/permissions/%2F/{name}")[1] == expected
    assert http_call(broker, "GET", f"/api/users/{name}/permissions")[1] == [expected]
    assert expected in http_call(broker, "GET", "/api/vhosts/%2F/permissions")[1]
    assert expected in http_call(broker, "GET", "/api/permissions")[1]
    status, body, _ = http_call(broker, "PUT", f"/api/permissions/%2F/{name}", {"configure": ".*", "write": ".*"})
    assert status == 400 and "'read'" in body["reason"]
    status, body, _ = http_call(broker, "PUT", f"/api/permissions/%2F/{name}", {**perms, "read": "("})
    assert status == 400 and "regex" in body["reason"]
    assert http_call(broker, "PUT", "/api/permissions/no-such-vhost/" + name, perms)[0] == 404
    assert http_call(broker, "DELETE", f"/api/permissions/%2F/{name}")[0] == 204
    assert http_call(broker, "GET", f"/api/users/{name}/permissions")[1] == []


def test_vhost_lifecycle_and_delete_closes_its_connections(broker):
    vhost = _name("vh")
    assert http_call(broker, "PUT", f"/api/vhosts/{vhost}", {"description": "test vhost"})[0] == 201
    assert http_call(broker, "PUT", f"/api/vhosts/{vhost}")[0] == 204
    status, body, _ = http_call(broker, "GET", f"/api/vhosts/{vhost}")
    assert status == 200 and body["name"] == vhost and body["description"] == "test vhost"
    assert vhost in {v["name"] for v in http_call(broker, "GET", "/api/vhosts")[1]}
    # the creator (guest) was granted full permissions with the vhost, as RabbitMQ does: this is an update
    assert http_call(broker, "GET", f"/api/permissions/{vhost}/guest")[1]["configure"] == ".*"
    assert http_call(broker, "PUT", f"/api/permissions/{vhost}/guest", FULL)[0] == 204
    conn = _amqp(broker, "guest", "guest", vhost)
    ch = conn.channel()
    ch.queue_declare("kept", durable=True)
    ch.basic_publish("", "kept", b"m", pika.BasicProperties(delivery_mode=2))
    other = _amqp(broker, "guest", "guest")  # another vhost's connection is not touched
    try:
        assert http_call(broker, "DELETE", f"/api/vhosts/{vhost}")[0] == 204
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as exc:
            conn.process_data_events(2)
            ch.queue_declare("kept", passive=True)
        assert exc.value.reply_code == 320
        assert other.is_open
        other.channel().queue_declare(_name("still"), auto_delete=True)
    finally:
        other.close()
    assert http_call(broker, "GET", f"/api/vhosts/{vhost}")[0] == 404
    assert http_call(broker, "DELETE", f"/api/vhosts/{vhost}")[0] == 404
    # A vhost of the same name starts empty: no queue, no permissions but its creator's.
    assert http_call(broker, "PUT", f"/api/vhosts/{vhost}")[0] == 201
    assert [p["user"] for p in http_call(broker, "GET", f"/api/vhosts/{vhost}/permissions")[1]] == ["guest"]
    conn = _amqp(broker, "guest", "guest", vhost)
    try:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
            conn.channel().queue_declare("kept", passive=True)
        assert exc.value.reply_code == 404
    finally:
        conn.close()
    assert http_call(broker, "DELETE", f"/api/vhosts/{vhost}")[0] == 204


def test_policy_put_applies_at_once_and_validates_keys(broker, clients):
    queue = clients.track_queue(_name("polq"))
    _, ch = clients.channel()
    ch.queue_declare(queue)
    for i in range(5):
        ch.basic_publish("", queue, str(i).encode())
    policy = _name("pol")
    body = {"pattern": f"^{queue}$", "definition": {"max-length": 2}, "apply-to": "queues", "priority": 3}
    assert http_call(broker, "PUT", f"/api/policies/%2F/{policy}", body)[0] == 201
    assert ch.queue_declare(queue, passive=True).method.message_count == 2
    expected = {"vhost": "/", "name": policy, "pattern": f"^{queue}$", "apply-to": "queues",
                "definition": {"max-length": 2}, "priority": 3}
    assert http_call(broker, "GET", f"/api/policies/%2F/{policy}")[1] == expected
    assert expected in http_call(broker, "GET", "/api/policies/%2F")[1]
    assert expected in http_call(broker, "GET", "/api/policies")[1]
    status, reply, _ = http_call(broker, "PUT", f"/api/policies/%2F/{policy}",
                                 {"pattern": ".*", "definition": {"max-lenght": 1}})
    assert status == 400 and "max-lenght" in reply["reason"]
    status, reply, _ = http_call(broker, "PUT", f"/api/policies/%2F/{policy}",
                                 {"pattern": ".*", "definition": {"message-ttl": "soon"}})
    assert status == 400 and "message-ttl" in reply["reason"]
    status, reply, _ = http_call(broker, "PUT", f"/api/policies/%2F/{policy}", {"definition": {"max-length": 1}})
    assert status == 400 and "pattern" in reply["reason"]
    assert http_call(broker, "GET", f"/api/policies/%2F/{policy}")[1] == expected  # unchanged
    assert http_call(broker, "DELETE", f"/api/policies/%2F/{policy}")[0] == 204
    assert http_call(broker, "GET", f"/api/policies/%2F/{policy}")[0] == 404
    assert http_call(broker, "DELETE", f"/api/policies/%2F/{policy}")[0] == 404
    for i in range(3):
        ch.basic_publish("", queue, str(i).encode())
    assert ch.queue_declare(queue, passive=True).method.message_count == 5  # limit gone at once


def test_tag_rules(broker):
    mine, other = _name("mine"), _name("other")
    for vhost in (mine, other):
        assert http_call(broker, "PUT", f"/api/vhosts/{vhost}")[0] == 201
    users = {tag: _name(tag) for tag in ("administrator", "monitoring", "policymaker", "management", "none")}
    for tag, name in users.items():
        _user(broker, name, "pw", "" if tag == "none" else tag, vhost=mine)
    try:
        def call(tag: str, method: str, path: str, body=None) -> int:
            return http_call(broker, method, path, body, user=users[tag], password="pw")[0]

        assert http_call(broker, "GET", "/api/whoami", user=users["management"], password="wrong")[0] == 401
        assert call("none", "GET", "/api/whoami") == 401
        assert call("none", "GET", "/api/vhosts") == 401
        policy = {"pattern": "^x", "definition": {"max-length": 9}}
        # Only administrators change or see users and permissions, and change vhosts.
        for tag in ("monitoring", "policymaker", "management"):
            assert call(tag, "GET", "/api/users") == 401
            assert call(tag, "PUT", f"/api/users/{_name('x')}", {"password": "p"}) == 401
            assert call(tag, "PUT", f"/api/vhosts/{_name('x')}") == 401
            assert call(tag, "DELETE", f"/api/vhosts/{other}") == 401
            assert call(tag, "PUT", f"/api/permissions/{other}/{users[tag]}", FULL) == 401
            assert call(tag, "GET", "/api/permissions") == 401
            assert call(tag, "GET", "/api/definitions") == 401
        assert call("administrator", "PUT", f"/api/users/{_name('made')}", {"password": "p"}) == 201
        # Policies: policymaker on its own vhosts; monitoring and management may not change them.
        assert call("policymaker", "PUT", f"/api/policies/{mine}/p1", policy) == 201
        assert call("policymaker", "PUT", f"/api/policies/{other}/p1", policy) == 401
        assert call("monitoring", "PUT", f"/api/policies/{mine}/p2", policy) == 401
        assert call("management", "PUT", f"/api/policies/{mine}/p2", policy) == 401
        assert call("management", "DELETE", f"/api/policies/{mine}/p1") == 401
        assert call("administrator", "PUT", f"/api/policies/{other}/p1", policy) == 201
        # Seeing: monitoring sees every vhost, management only those it has permissions on.
        seen = {t: {v["name"] for v in http_call(broker, "GET", "/api/vhosts", user=users[t], password="pw")[1]}
                for t in ("monitoring", "management")}
        assert {mine, other} <= seen["monitoring"]
        assert mine in seen["management"] and other not in seen["management"]
        assert call("management", "GET", f"/api/vhosts/{other}") == 401
        # Policies are read by policymakers and administrators only: monitoring does not imply policymaker.
        assert call("monitoring", "GET", f"/api/policies/{other}/p1") == 401
        assert call("monitoring", "GET", "/api/policies") == 401
        assert call("administrator", "GET", f"/api/policies/{other}/p1") == 200
        assert call("management", "GET", "/api/policies") == 401
        listed = http_call(broker, "GET", "/api/policies", user=users["policymaker"], password="pw")[1]
        assert {(p["vhost"], p["name"]) for p in listed} >= {(mine, "p1")}
        assert (other, "p1") not in {(p["vhost"], p["name"]) for p in listed}
        # A tag change applies to the next request.
        assert http_call(broker, "PUT", f"/api/users/{users['management']}", {"tags": "administrator"})[0] == 204
        assert call("management", "GET", "/api/users") == 200
    finally:
        for name in users.values():
            http_call(broker, "DELETE", f"/api/users/{name}")
        for vhost in (mine, other):
            http_call(broker, "DELETE", f"/api/vhosts/{vhost}")


def test_policy_put_applies_at_once_to_existing_exchanges(broker, clients):
    exchange, spill = _name("polx"), _name("spill")
    queue = clients.track_queue(_name("spillq"))
    clients.track_exchange(exchange)
    clients.track_exchange(spill)
    _, ch = clients.channel()
    ch.exchange_declare(exchange, "direct")
    ch.exchange_declare(spill, "fanout")
    ch.queue_declare(queue)
    ch.queue_bind(queue, spill)
    policy = _name("ae")
    body = {"pattern": f"^{exchange}$", "apply-to": "exchanges", "definition": {"alternate-exchange": spill}}
    assert http_call(broker, "PUT", f"/api/policies/%2F/{policy}", body)[0] == 201
    try:
        ch.basic_publish(exchange, "unroutable", b"x")
        assert ch.queue_declare(queue, passive=True).method.message_count == 1
    finally:
        assert http_call(broker, "DELETE", f"/api/policies/%2F/{policy}")[0] == 204
    ch.basic_publish(exchange, "unroutable", b"y")
    assert ch.queue_declare(queue, passive=True).method.message_count == 1
