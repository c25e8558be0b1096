"""Names at the HTTP face: over 255 bytes is a 400 with RabbitMQ's error JSON naming the problem (it
was a 500 and a traceback), from the API and from a definitions import; any name at all gets a 2xx or a
4xx with a JSON error, never a 5xx. And the API's use_regex name filter is bounded."""

from __future__ import annotations

import time
import urllib.parse
import uuid

import pika
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.conftest import http_call

LONG = "n" * 300
LONG_UTF8 = "é" * 128  # 128 characters, 256 bytes


def _q(text: str) -> str:
    return urllib.parse.quote(text, safe="")


def _refused_as_too_long(reply: tuple, what: str) -> None:
    status, body, _ = reply
    assert status == 400, (what, status, body)
    assert body["error"] == "bad_request" and "longer than the limit of 255 bytes" in body["reason"], (what, body)


def test_names_over_255_bytes_answer_400_naming_the_problem(broker):
    queue = f"q-{uuid.uuid4().hex[:8]}"
    assert http_call(broker, "PUT", f"/api/queues/%2F/{queue}", {})[0] == 201
    for name in (LONG, LONG_UTF8):
        cases = {
            "queue name": ("PUT", f"/api/queues/%2F/{_q(name)}", {}),
            "exchange name": ("PUT", f"/api/exchanges/%2F/{_q(name)}", {"type": "direct"}),
            "vhost name": ("PUT", f"/api/vhosts/{_q(name)}", {}),
            "user name": ("PUT", f"/api/users/{_q(name)}", {"password": "p", "tags": ""}),
            "policy name": ("PUT", f"/api/policies/%2F/{_q(name)}", {"pattern": "^x", "definition": {"max-length": 1}}),
            "operator policy": ("PUT", f"/api/operator-policies/%2F/{_q(name)}",
                                {"pattern": "^x", "definition": {"max-length": 1}}),
            "parameter name": ("PUT", f"/api/parameters/vhost-limits/%2F/{_q(name)}", {"value": {"max-queues": 9}}),
            "global parameter": ("PUT", f"/api/global-parameters/{_q(name)}", {"value": 1}),
            "binding key": ("POST", f"/api/bindings/%2F/e/amq.direct/q/{queue}", {"routing_key": name}),
            "publish key": ("POST", "/api/exchanges/%2F/amq.direct/publish",
                            {"routing_key": name, "payload": "x", "payload_encoding": "string", "properties": {}}),
            "topic permission": ("PUT", "/api/topic-permissions/%2F/guest",
                                 {"exchange": name, "write": ".*", "read": ".*"}),
            "dead-letter exchange": ("PUT", f"/api/queues/%2F/{queue}-dl",
                                     {"arguments": {"x-dead-letter-exchange": name}}),
            "policy's dead-letter exchange": ("PUT", "/api/policies/%2F/dl",
                                              {"pattern": "^x", "definition": {"dead-letter-exchange": name}}),
        }
        for what, (method, path, body) in cases.items():
            _refused_as_too_long(http_call(broker, method, path, body), what)
    # Nothing was made, and the queue has no binding that its definitions could not hold.
    assert [b for b in http_call(broker, "GET", f"/api/queues/%2F/{queue}/bindings")[1] if b["source"]] == []
    assert http_call(broker, "GET", f"/api/queues/%2F/{queue}-dl")[0] == 404
    # 255 bytes exactly is a name like any other.
    fits = "m" * 255
    assert http_call(broker, "PUT", f"/api/queues/%2F/{fits}", {})[0] == 201
    assert http_call(broker, "POST", f"/api/bindings/%2F/e/amq.direct/q/{fits}", {"routing_key": fits})[0] == 201
    assert http_call(broker, "DELETE", f"/api/queues/%2F/{fits}")[0] == 204
    assert "Traceback" not in broker.log


def test_a_definitions_import_refuses_long_names_and_imports_nothing(broker):
    vhost = f"imp-{uuid.uuid4().hex[:8]}"
    doc = {
        "vhosts": [{"name": vhost}, {"name": LONG}],
        "users": [{"name": LONG, "password_hash": "", "tags": ""}],
        "queues": [{"name": LONG, "vhost": vhost, "durable": True}, {"name": "ok", "vhost": vhost}],
        "exchanges": [{"name": LONG, "vhost": vhost, "type": "direct"}],
        "bindings": [{"source": "amq.direct", "vhost": vhost, "destination": "ok", "destination_type": "queue",
                      "routing_key": LONG}],
        "policies": [{"name": LONG, "vhost": vhost, "pattern": ".*", "definition": {"max-length": 1}}],
        "parameters": [{"component": "vhost-limits", "vhost": vhost, "name": LONG, "value": {"max-queues": 1}}],
        "global_parameters": [{"name": LONG, "value": 1}],
        "topic_permissions": [{"user": "guest", "vhost": vhost, "exchange": LONG, "write": ".*", "read": ".*"}],
    }
    status, body, _ = http_call(broker, "POST", "/api/definitions", doc)
    assert status == 400 and body["error"] == "bad_request", body
    assert "nothing imported" in body["reason"]
    for what in ("vhost name", "user name", "queue name", "exchange name", "routing key", "policy name"):
        assert f"{what} is 300 bytes long" in body["reason"], (what, body["reason"])
    assert http_call(broker, "GET", f"/api/vhosts/{vhost}")[0] == 404
    # A shovel's queue names are held to the same limit.
    assert http_call(broker, "PUT", "/api/vhosts/shv", {})[0] in (201, 204)
    status, body, _ = http_call(broker, "PUT", "/api/parameters/shovel/shv/s1", {"value": {
        "src-uri": "amqp://", "src-queue": LONG, "dest-uri": "amqp://", "dest-queue": "d"}})
    assert status == 400 and "255 bytes" in body["reason"], body


def test_amqp_clients_cannot_reach_past_the_limit(broker):
    # Over AMQP a name is a short string: a client cannot send 256 bytes, and the arguments table
    # (long strings) is checked as the API checks it.
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        try:
            ch.queue_declare(f"q-{uuid.uuid4().hex[:8]}", arguments={"x-dead-letter-exchange": LONG})
            raise AssertionError("declared")
        except pika.exceptions.ChannelClosedByBroker as e:
            assert e.reply_code == 406 and "255 bytes" in e.reply_text
    finally:
        conn.close()


NAME = st.text(st.characters(codec="utf-8"), min_size=1, max_size=300) | st.text(min_size=250, max_size=300)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(name=NAME, kind=st.sampled_from(["queues/%2F", "exchanges/%2F", "vhosts", "users", "policies/%2F",
                                        "operator-policies/%2F", "global-parameters", "bindings-key", "publish-key",
                                        "definitions"]))
def test_any_name_gets_2xx_or_a_4xx_json_error(broker, name, kind):
    bodies = {"queues/%2F": {}, "exchanges/%2F": {"type": "fanout"}, "vhosts": {},
              "users": {"password": "p", "tags": ""},
              "policies/%2F": {"pattern": "^hyp-never", "definition": {"max-length": 1}},
              "operator-policies/%2F": {"pattern": "^hyp-never", "definition": {"max-length": 1}},
              "global-parameters": {"value": 1}}
    if kind == "bindings-key":
        http_call(broker, "PUT", "/api/queues/%2F/hyp-bind", {})
        method, path, body = "POST", "/api/bindings/%2F/e/amq.topic/q/hyp-bind", {"routing_key": name}
    elif kind == "definitions":  # a queue and an exchange of that name, bound by it, in one document
        method, path = "POST", "/api/definitions"
        body = {"queues": [{"name": name, "vhost": "/"}], "exchanges": [{"name": name, "vhost": "/", "type": "topic"}],
                "bindings": [{"source": name, "vhost": "/", "destination": name, "destination_type": "queue",
                              "routing_key": name}]}
    elif kind == "publish-key":
        method, path = "POST", "/api/exchanges/%2F/amq.topic/publish"
        body = {"routing_key": name, "payload": "x", "payload_encoding": "string", "properties": {}}
    else:
        method, path, body = "PUT", f"/api/{kind}/{_q(name)}", bodies[kind]
    status, reply, _ = http_call(broker, method, path, body)
    assert status < 500, (status, reply)
    if status >= 400:
        assert isinstance(reply, dict) and reply.get("error") and isinstance(reply.get("reason"), str), reply
    elif method == "PUT":  # made: listed, read back by its name, and deleted
        assert http_call(broker, "GET", path)[0] == 200
        assert http_call(broker, "DELETE", path)[0] == 204
    elif kind == "definitions":
        assert http_call(broker, "GET", f"/api/queues/%2F/{_q(name)}")[0] == 200
        assert http_call(broker, "DELETE", f"/api/queues/%2F/{_q(name)}")[0] == 204
        assert http_call(broker, "DELETE", f"/api/exchanges/%2F/{_q(name)}")[0] == 204


def test_any_utf8_name_is_stored_and_recovered(fresh_broker):
    # pamqp's command check refused such names when the definitions log was written (a 500); RabbitMQ
    # takes any UTF-8 name.
    b = fresh_broker
    names = ["a;b", "é-ü-名前", "tab\there", "emoji-\U0001f407", "sp ace!?*[](){}", "{tenant}.orders"]
    for name in names:
        assert http_call(b, "PUT", f"/api/exchanges/%2F/{_q(name)}", {"type": "direct", "durable": True})[0] == 201
        assert http_call(b, "PUT", f"/api/queues/%2F/{_q(name)}", {"durable": True})[0] == 201
        assert http_call(b, "POST", f"/api/bindings/%2F/e/{_q(name)}/q/{_q(name)}", {"routing_key": name})[0] == 201
        assert http_call(b, "POST", f"/api/exchanges/%2F/{_q(name)}/publish",
                         {"routing_key": name, "payload": "kept", "payload_encoding": "string",
                          "properties": {"delivery_mode": 2}})[1] == {"routed": True}
    b.restart()
    for name in names:
        status, queue, _ = http_call(b, "GET", f"/api/queues/%2F/{_q(name)}")
        assert status == 200 and queue["messages"] == 1, (name, queue)
        bindings = http_call(b, "GET", f"/api/queues/%2F/{_q(name)}/bindings")[1]
        assert [x["routing_key"] for x in bindings if x["source"] == name] == [name]


def test_regex_filters_are_bounded(broker):
    for i in range(3):
        assert http_call(broker, "PUT", f"/api/queues/%2F/{'a' * 200}{i}", {})[0] == 201
    ok = http_call(broker, "GET", "/api/queues/%2F?name=%5Ea%7B200%7D1%24&use_regex=true")
    assert ok[0] == 200 and [q["name"] for q in ok[1]] == ["a" * 200 + "1"]
    # A pattern that backtracks for ever over a 200-character name: refused within the budget, the
    # broker still serving.
    started = time.monotonic()
    status, body, _ = http_call(broker, "GET", "/api/queues?name=" + _q("(a|aa)+$") + "&use_regex=true")
    assert status == 400 and "too long to match" in body["reason"], body
    assert time.monotonic() - started < 2
    status, body, _ = http_call(broker, "GET", "/api/queues?name=" + _q("(a+a+)+y") + "&use_regex=true&page=1")
    assert status == 400, body
    # Not a regular expression, or too long to be one of a name.
    for pattern in ("(", "a{2,1}", "[z-a]", "(?P<x", "x" * 256):
        status, body, _ = http_call(broker, "GET", "/api/queues?name=" + _q(pattern) + "&use_regex=true")
        assert status == 400 and body["error"] == "bad_request", (pattern, body)
    for route in ("exchanges", "vhosts", "users", "connections", "channels", "policies"):
        status, body, _ = http_call(broker, "GET", f"/api/{route}?name=%28&use_regex=true")
        assert status == 400, (route, body)
    assert http_call(broker, "GET", "/api/overview")[0] == 200
    assert "Traceback" not in broker.log
