"""Topic permissions, as RabbitMQ's: set over /api/topic-permissions, enforced on AMQP publish (routing
key against ``write``), queue.bind and exchange.bind (binding key against ``read``) and the HTTP
publish, with ``{username}``/``{vhost}`` expansion and RabbitMQ's 403 texts; the connection stays
usable (only the channel closes); they survive a restart and apply at once when changed."""

from __future__ import annotations

import urllib.parse

import pika
import pytest

from . import channel_closed, uid
from .conftest import http_call

PASSWORD = "tp-secret"


def _q(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def _setup(b, *, write: str = "^{username}\\.", read: str = "^public\\.") -> tuple[str, str]:
    vhost, user = uid("tpv"), uid("tpu")
    assert http_call(b, "PUT", f"/api/vhosts/{_q(vhost)}", {})[0] == 201
    assert http_call(b, "PUT", f"/api/users/{user}", {"password": PASSWORD, "tags": "management"})[0] == 201
    assert http_call(b, "PUT", f"/api/permissions/{_q(vhost)}/{user}",
                     {"configure": ".*", "write": ".*", "read": ".*"})[0] == 201
    status, _, _ = http_call(b, "PUT", f"/api/topic-permissions/{_q(vhost)}/{user}",
                             {"exchange": "amq.topic", "write": write, "read": read})
    assert status == 201
    return vhost, user


def _connect(b, vhost: str, user: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(b.url_for(user, PASSWORD, vhost)))


def test_publish_checks_the_routing_key_against_write(broker):
    vhost, user = _setup(broker)
    conn = _connect(broker, vhost, user)
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(q, "amq.topic", "public.#")
        ch.confirm_delivery()
        ch.basic_publish("amq.topic", f"{user}.a", b"ok")  # {username} expanded
        with channel_closed(403) as closed:
            ch.basic_publish("amq.topic", "other.a", b"refused")
            ch.basic_qos(prefetch_count=0)
        assert closed.reply_text == (f"ACCESS_REFUSED - write access to topic 'other.a' in exchange 'amq.topic' "
                                     f"in vhost '{vhost}' refused for user '{user}'")
        # The connection stays usable; other exchanges are not touched by a topic permission.
        ch2 = conn.channel()
        ch2.exchange_declare("tx-other", "topic")
        ch2.confirm_delivery()
        ch2.basic_publish("tx-other", "other.a", b"no topic permission on this exchange")
        ch2.basic_publish("amq.direct", "other.a", b"not a topic exchange")
        # A run of publishes with a refused key: refused once, channel closed.
        ch3 = conn.channel()
        with channel_closed(403, "write access to topic 'x.y'"):
            for _ in range(5):
                ch3.basic_publish("amq.topic", "x.y", b"r")
            ch3.basic_qos(prefetch_count=0)
        assert conn.is_open
    finally:
        conn.close()


def test_bind_checks_the_binding_key_against_read(broker):
    vhost, user = _setup(broker)
    conn = _connect(broker, vhost, user)
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(q, "amq.topic", "public.news")
        with channel_closed(403) as closed:
            ch.queue_bind(q, "amq.topic", "secret.#")
        assert closed.reply_text == (f"ACCESS_REFUSED - read access to topic 'secret.#' in exchange 'amq.topic' "
                                     f"in vhost '{vhost}' refused for user '{user}'")
        ch = conn.channel()
        ch.exchange_declare("tp-dest", "fanout")
        ch.exchange_bind("tp-dest", "amq.topic", "public.x")
        with channel_closed(403, "read access to topic 'secret'"):
            ch.exchange_bind("tp-dest", "amq.topic", "secret")
        ch = conn.channel()
        with channel_closed(403, "read access to topic 'secret'"):
            ch.queue_unbind(q, "amq.topic", "secret")
        assert conn.is_open
    finally:
        conn.close()


def test_http_publish_is_checked_too(broker):
    vhost, user = _setup(broker)
    path = f"/api/exchanges/{_q(vhost)}/amq.topic/publish"
    body = {"properties": {}, "routing_key": "other.a", "payload": "x", "payload_encoding": "string"}
    status, reply, _ = http_call(broker, "POST", path, body, user=user, password=PASSWORD)
    assert status == 401, reply
    assert reply["reason"] == (f"write access to topic 'other.a' in exchange 'amq.topic' in vhost '{vhost}' "
                               f"refused for user '{user}'")
    body["routing_key"] = f"{user}.a"
    status, reply, _ = http_call(broker, "POST", path, body, user=user, password=PASSWORD)
    assert status == 200, reply


def test_api_lists_changes_and_deletes(broker):
    vhost, user = _setup(broker, write="^{vhost}-", read=".*")
    entry = {"user": user, "vhost": vhost, "exchange": "amq.topic", "write": "^{vhost}-", "read": ".*"}
    assert http_call(broker, "GET", f"/api/topic-permissions/{_q(vhost)}/{user}")[1] == [entry]
    assert http_call(broker, "GET", f"/api/users/{user}/topic-permissions")[1] == [entry]
    assert http_call(broker, "GET", f"/api/vhosts/{_q(vhost)}/topic-permissions")[1] == [entry]
    assert entry in http_call(broker, "GET", "/api/topic-permissions")[1]
    conn = _connect(broker, vhost, user)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("amq.topic", f"{vhost}-a", b"ok")  # {vhost} expanded
        # A change applies to the open channel's next publish (it caches the exchange, not the answer).
        assert http_call(broker, "PUT", f"/api/topic-permissions/{_q(vhost)}/{user}",
                         {"exchange": "amq.topic", "write": "^only$", "read": ".*"})[0] == 204
        with channel_closed(403, f"write access to topic '{vhost}-a'"):
            ch.basic_publish("amq.topic", f"{vhost}-a", b"now refused")
            ch.basic_qos(prefetch_count=0)
        assert http_call(broker, "DELETE", f"/api/topic-permissions/{_q(vhost)}/{user}")[0] == 204
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("amq.topic", "anything", b"no topic permission: all allowed, as RabbitMQ")
    finally:
        conn.close()
    assert http_call(broker, "GET", f"/api/topic-permissions/{_q(vhost)}/{user}")[0] == 404
    assert http_call(broker, "DELETE", f"/api/topic-permissions/{_q(vhost)}/{user}")[0] == 404


@pytest.mark.parametrize("body, needle", [
    ({"write": ".*", "read": ".*"}, "'exchange' must be a string"),
    ({"exchange": "amq.topic", "write": "(", "read": ".*"}, "write topic permission regex"),
    ({"exchange": "amq.topic", "write": ".*", "read": 5}, "'read' must be a string"),
])
def test_bad_bodies_are_400_naming_the_problem(broker, body, needle):
    vhost, user = _setup(broker)
    status, reply, _ = http_call(broker, "PUT", f"/api/topic-permissions/{_q(vhost)}/{user}", body)
    assert status == 400 and needle in reply["reason"], reply
    assert http_call(broker, "PUT", f"/api/topic-permissions/{_q(vhost)}/nobody-{uid()}",
                     {"exchange": "amq.topic", "write": ".*", "read": ".*"})[0] == 404
    assert http_call(broker, "PUT", f"/api/topic-permissions/no-vhost-{uid()}/{user}",
                     {"exchange": "amq.topic", "write": ".*", "read": ".*"})[0] == 404


def test_topic_permissions_survive_a_restart(fresh_broker):
    b = fresh_broker
    vhost, user = _setup(b)
    b.restart()
    conn = _connect(b, vhost, user)
    try:
        ch = conn.channel()
        with channel_closed(403, "write access to topic 'other'"):
            ch.basic_publish("amq.topic", "other", b"refused after restart")
            ch.basic_qos(prefetch_count=0)
    finally:
        conn.close()


def test_http_bind_is_checked_too(broker):
    vhost, user = _setup(broker)
    conn = _connect(broker, vhost, user)
    try:
        conn.channel().queue_declare("tp-q", durable=False)
    finally:
        conn.close()
    path = f"/api/bindings/{_q(vhost)}/e/amq.topic/q/tp-q"
    status, reply, _ = http_call(broker, "POST", path, {"routing_key": "secret.#"}, user=user, password=PASSWORD)
    assert status == 401, reply
    assert reply["reason"] == (f"read access to topic 'secret.#' in exchange 'amq.topic' in vhost '{vhost}' "
                               f"refused for user '{user}'")
    status, reply, _ = http_call(broker, "POST", path, {"routing_key": "public.#"}, user=user, password=PASSWORD)
    assert status == 201, reply
