"""The management API's authentication, errors and list parameters (real HTTP, real broker)."""

from __future__ import annotations

import base64
import urllib.error
import urllib.request
import uuid

from .conftest import http_call, make_admin


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_wrong_password_is_401_with_challenge(broker):
    status, body, headers = http_call(broker, "GET", "/api/exchanges", password="wrong")
    assert status == 401
    assert body == {"error": "not_authorized", "reason": "Not_Authorized"}
    assert headers["WWW-Authenticate"].startswith("Basic")


def test_no_credentials_is_401(broker):
    request = urllib.request.Request(broker.http_url + "/api/exchanges")
    try:
        urllib.request.urlopen(request, timeout=10)
        raise AssertionError("expected 401")
    except urllib.error.HTTPError as e:
        assert e.code == 401
        assert "WWW-Authenticate" in e.headers


def test_user_without_tags_is_401(fresh_broker):
    admin = make_admin(fresh_broker)
    admin.add_user("plain", "pw")
    admin.set_permissions("plain", "/", ".*", ".*", ".*")
    admin.apply()
    status, body, _ = http_call(fresh_broker, "GET", "/api/exchanges", user="plain", password="pw")
    # RabbitMQ answers an authorisation refusal with 401 too; the error field tells it from bad credentials.
    assert status == 401
    assert body == {"error": "not_authorised", "reason": "Not management user"}


def test_unknown_path_is_404_json(broker):
    status, body, _ = http_call(broker, "GET", "/api/no-such-thing")
    assert status == 404
    assert body == {"error": "Object Not Found", "reason": "Not Found"}


def test_unknown_vhost_is_404(broker):
    status, body, _ = http_call(broker, "GET", "/api/exchanges/nowhere")
    assert status == 404
    assert body["error"] == "Object Not Found"


def test_exchanges_listed_with_default_vhost_as_percent_2f(broker):
    status, body, _ = http_call(broker, "GET", "/api/exchanges/%2F")
    assert status == 200
    names = {x["name"] for x in body}
    assert {"", "amq.direct", "amq.fanout", "amq.topic", "amq.headers"} <= names
    direct = next(x for x in body if x["name"] == "amq.direct")
    assert direct["vhost"] == "/" and direct["type"] == "direct" and direct["durable"] is True


def test_paged_list_shape_as_rabbitmq(broker):
    status, body, _ = http_call(broker, "GET", "/api/exchanges/%2F?page=1&page_size=2&name=amq.&sort=name"
                                               "&sort_reverse=true&columns=name,type")
    assert status == 200
    assert set(body) == {"filtered_count", "item_count", "items", "page", "page_count", "page_size",
                         "total_count"}
    assert body["page"] == 1 and body["page_size"] == 2 and body["item_count"] == 2
    assert body["filtered_count"] >= 5 and body["total_count"] > body["filtered_count"]
    assert body["page_count"] == -(-body["filtered_count"] // 2)
    names = [x["name"] for x in body["items"]]
    assert names == sorted(names, reverse=True)
    assert all(set(x) == {"name", "type"} for x in body["items"])


def test_name_regex_filter_and_bad_page(broker):
    status, body, _ = http_call(broker, "GET", "/api/exchanges/%2F?name=%5Eamq%5C.(direct%7Cfanout)%24"
                                               "&use_regex=true")
    assert status == 200
    assert sorted(x["name"] for x in body) == ["amq.direct", "amq.fanout"]
    status, body, _ = http_call(broker, "GET", "/api/exchanges?page=0")
    assert status == 400 and body["error"] == "bad_request" and "page" in body["reason"]


def test_basic_header_garbage_is_401(broker):
    status, _, _ = http_call(broker, "GET", "/api/exchanges",
                             headers={"Authorization": "Basic " + base64.b64encode(b"nocolon").decode()})
    assert status == 401


# --- exchanges ----------------------------------------------------------------------------------------

def test_exchange_put_get_delete(broker, clients):
    name = clients.track_exchange(_name("hx"))
    path = f"/api/exchanges/%2F/{name}"
    status, _, _ = http_call(broker, "PUT", path, {"type": "topic", "durable": False, "arguments": {}})
    assert status == 201
    status, _, _ = http_call(broker, "PUT", path, {"type": "topic", "durable": False})
    assert status == 204
    status, body, _ = http_call(broker, "GET", path)
    assert status == 200
    assert (body["name"], body["type"], body["durable"], body["auto_delete"], body["vhost"]) == \
           (name, "topic", False, False, "/")
    # The AMQP face sees the same exchange.
    _, ch = clients.channel()
    ch.exchange_declare(name, "topic", passive=True)
    status, body, _ = http_call(broker, "PUT", path, {"type": "direct", "durable": False})
    assert status == 400 and "inequivalent arg 'type'" in body["reason"]
    assert http_call(broker, "DELETE", path)[0] == 204
    assert http_call(broker, "GET", path)[0] == 404
    assert http_call(broker, "DELETE", path)[0] == 404


def test_exchange_delete_if_unused(broker, clients):
    x, q = clients.track_exchange(_name("hx")), clients.track_queue(_name("hq"))
    _, ch = clients.channel()
    ch.exchange_declare(x, "fanout")
    ch.queue_declare(q)
    ch.queue_bind(q, x)
    status, body, _ = http_call(broker, "DELETE", f"/api/exchanges/%2F/{x}?if-unused=true")
    assert status == 400 and "in use" in body["reason"]
    assert http_call(broker, "DELETE", f"/api/exchanges/%2F/{x}")[0] == 204


def test_exchange_put_bad_json_and_missing_type(broker):
    status, body, _ = http_call(broker, "PUT", "/api/exchanges/%2F/whatever", raw=b"{not json")
    assert status == 400 and body["error"] == "bad_request" and "JSON" in body["reason"]
    status, body, _ = http_call(broker, "PUT", "/api/exchanges/%2F/whatever", {"durable": True})
    assert status == 400 and "type" in body["reason"]
    status, body, _ = http_call(broker, "PUT", "/api/exchanges/%2F/amq.nope", {"type": "direct"})
    assert status == 401 and "reserved prefix" in body["reason"]


def test_publish_routed_and_unrouted(broker, clients):
    q = clients.track_queue(_name("hq"))
    _, ch = clients.channel()
    ch.queue_declare(q)
    status, body, _ = http_call(broker, "POST", "/api/exchanges/%2F/amq.default/publish",
                                {"properties": {"content_type": "text/plain", "headers": {"h": 1},
                                                "delivery_mode": 2},
                                 "routing_key": q, "payload": "aGk=", "payload_encoding": "base64"})
    assert (status, body) == (200, {"routed": True})
    method, props, body_bytes = ch.basic_get(q, auto_ack=True)
    assert body_bytes == b"hi" and props.content_type == "text/plain" and props.headers == {"h": 1}
    status, body, _ = http_call(broker, "POST", "/api/exchanges/%2F/amq.default/publish",
                                {"properties": {}, "routing_key": "nowhere-" + q, "payload": "x",
                                 "payload_encoding": "string"})
    assert (status, body) == (200, {"routed": False})
    status, body, _ = http_call(broker, "POST", "/api/exchanges/%2F/amq.default/publish",
                                {"properties": {"bogus": 1}, "routing_key": q, "payload": "x",
                                 "payload_encoding": "string"})
    assert status == 400 and "bogus" in body["reason"]
    status, body, _ = http_call(broker, "POST", "/api/exchanges/%2F/no-such-x/publish",
                                {"properties": {}, "routing_key": q, "payload": "x", "payload_encoding": "string"})
    assert status == 404


def test_exchange_binding_lists(broker, clients):
    src, dst, q = (clients.track_exchange(_name("src")), clients.track_exchange(_name("dst")),
                   clients.track_queue(_name("hq")))
    _, ch = clients.channel()
    ch.exchange_declare(src, "direct")
    ch.exchange_declare(dst, "fanout")
    ch.queue_declare(q)
    ch.exchange_bind(dst, src, "k1")
    ch.queue_bind(q, src, "k2")
    status, body, _ = http_call(broker, "GET", f"/api/exchanges/%2F/{src}/bindings/source")
    assert status == 200
    assert sorted((b["destination"], b["destination_type"], b["routing_key"]) for b in body) == \
           sorted([(dst, "exchange", "k1"), (q, "queue", "k2")])
    status, body, _ = http_call(broker, "GET", f"/api/exchanges/%2F/{dst}/bindings/destination")
    assert [(b["source"], b["routing_key"]) for b in body] == [(src, "k1")]


# --- queues -------------------------------------------------------------------------------------------

def test_queue_put_get_delete_and_json_fields(broker, clients):
    q = clients.track_queue(_name("hq"))
    path = f"/api/queues/%2F/{q}"
    assert http_call(broker, "PUT", path, {"durable": True, "arguments": {"x-max-length": 10}})[0] == 201
    assert http_call(broker, "PUT", path, {"durable": True, "arguments": {"x-max-length": 10}})[0] == 204
    _, ch = clients.channel()
    ch.basic_publish("", q, b"one")
    ch.basic_publish("", q, b"two")
    ch.basic_get(q)  # one unacked
    status, body, _ = http_call(broker, "GET", path)
    assert status == 200
    for key in ("name", "vhost", "durable", "auto_delete", "exclusive", "arguments", "messages",
                "messages_ready", "messages_unacknowledged", "consumers", "state", "type", "policy",
                "head_message_age_ms"):
        assert key in body, key
    assert body["arguments"] == {"x-max-length": 10}
    assert (body["messages"], body["messages_ready"], body["messages_unacknowledged"]) == (2, 1, 1)
    assert body["type"] == "classic" and body["state"] == "running"
    assert isinstance(body["head_message_age_ms"], int) and 0 <= body["head_message_age_ms"] < 60_000
    status, body, _ = http_call(broker, "PUT", path, {"durable": False})
    assert status == 400 and "inequivalent arg 'durable'" in body["reason"]
    status, body, _ = http_call(broker, "DELETE", path + "?if-empty=true")
    assert status == 400 and "not empty" in body["reason"]
    assert http_call(broker, "DELETE", path)[0] == 204
    assert http_call(broker, "GET", path)[0] == 404


def test_queue_bad_argument_is_400(broker):
    status, body, _ = http_call(broker, "PUT", f"/api/queues/%2F/{_name('hq')}",
                                {"arguments": {"x-max-length": "ten"}})
    assert status == 400 and "x-max-length" in body["reason"]


def test_queue_list_vhost_and_all(broker, clients):
    q = clients.track_queue(_name("hql"))
    _, ch = clients.channel()
    ch.queue_declare(q)
    for path in ("/api/queues", "/api/queues/%2F"):
        status, body, _ = http_call(broker, "GET", path)
        assert status == 200 and q in {x["name"] for x in body}
    status, body, _ = http_call(broker, "GET", f"/api/queues/%2F?page=1&page_size=1&name={q}")
    assert body["filtered_count"] == 1 and body["items"][0]["name"] == q


def test_purge_get_and_peek(broker, clients):
    q = clients.track_queue(_name("hq"))
    _, ch = clients.channel()
    ch.queue_declare(q)
    for i in range(4):
        ch.basic_publish("", q, f"m{i}".encode())
    path = f"/api/queues/%2F/{q}"
    status, body, _ = http_call(broker, "GET", path + "/peek?count=2")
    assert status == 200 and [m["payload"] for m in body] == ["m0", "m1"]
    assert http_call(broker, "GET", path)[1]["messages_ready"] == 4  # peek changed nothing
    status, body, _ = http_call(broker, "POST", path + "/get",
                                {"count": 2, "ackmode": "ack_requeue_true", "encoding": "auto"})
    assert status == 200 and [m["payload"] for m in body] == ["m0", "m1"]
    assert body[0]["payload_encoding"] == "string" and body[0]["payload_bytes"] == 2
    assert body[0]["routing_key"] == q and body[0]["exchange"] == ""
    assert http_call(broker, "GET", path)[1]["messages_ready"] == 4  # requeued
    if not broker.external:  # peek shows the flag their next delivery carries
        status, body, _ = http_call(broker, "GET", path + "/peek?count=3")
        assert [(m["payload"], m["redelivered"]) for m in body] == [("m0", True), ("m1", True), ("m2", False)]
    status, body, _ = http_call(broker, "POST", path + "/get",
                                {"count": 1, "ackmode": "ack_requeue_false", "encoding": "base64",
                                 "truncate": 1})
    assert status == 200 and body[0]["payload"] == "bQ==" and body[0]["payload_encoding"] == "base64"
    assert body[0]["redelivered"] is True and body[0]["payload_bytes"] == 2
    assert http_call(broker, "GET", path)[1]["messages_ready"] == 3
    status, body, _ = http_call(broker, "POST", path + "/get", {"count": 1, "ackmode": "sideways"})
    assert status == 400 and "ackmode" in body["reason"]
    assert http_call(broker, "DELETE", path + "/contents")[0] == 204
    assert http_call(broker, "GET", path)[1]["messages_ready"] == 0
    assert http_call(broker, "DELETE", f"/api/queues/%2F/{_name('missing')}/contents")[0] == 404


def test_get_reject_requeue_false_dead_letters(broker, clients):
    q, dlq = clients.track_queue(_name("hq")), clients.track_queue(_name("dlq"))
    _, ch = clients.channel()
    ch.queue_declare(dlq)
    ch.queue_declare(q, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    ch.basic_publish("", q, b"bad")
    status, body, _ = http_call(broker, "POST", f"/api/queues/%2F/{q}/get",
                                {"count": 1, "ackmode": "reject_requeue_false", "encoding": "auto"})
    assert status == 200 and body[0]["payload"] == "bad"
    method, props, got = ch.basic_get(dlq, auto_ack=True)
    assert got == b"bad" and props.headers["x-death"][0]["reason"] == "rejected"


def test_replay_moves_dead_letters_back(broker, clients):
    work, dlq = clients.track_queue(_name("work")), clients.track_queue(_name("dlq"))
    _, ch = clients.channel()
    ch.queue_declare(dlq)
    ch.queue_declare(work, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    for i in range(3):
        ch.basic_publish("", work, f"r{i}".encode())
    for _ in range(3):
        method, _, _ = ch.basic_get(work)
        ch.basic_reject(method.delivery_tag, requeue=False)
    ch.basic_publish("", dlq, b"never-died")  # no x-death: stays
    status, body, _ = http_call(broker, "POST", f"/api/queues/%2F/{dlq}/replay", {"count": 2})
    assert status == 200 and body == {"replayed": 2, "left": 0}
    status, body, _ = http_call(broker, "POST", f"/api/queues/%2F/{dlq}/replay", {"count": 10})
    assert body == {"replayed": 1, "left": 1}
    got = []
    while True:
        method, _, b = ch.basic_get(work, auto_ack=True)
        if method is None:
            break
        got.append(b)
    assert got == [b"r0", b"r1", b"r2"]
    method, _, b = ch.basic_get(dlq, auto_ack=True)
    assert b == b"never-died"
    status, body, _ = http_call(broker, "POST", f"/api/queues/%2F/{dlq}/replay", {})
    assert status == 400 and "count" in body["reason"]


def test_exclusive_queue_is_locked_over_http(broker, clients):
    _, ch = clients.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    status, body, _ = http_call(broker, "DELETE", f"/api/queues/%2F/{q}")
    assert status == 405 and "exclusive" in body["reason"]
    assert http_call(broker, "GET", f"/api/queues/%2F/{q}")[1]["exclusive"] is True


# --- bindings -----------------------------------------------------------------------------------------

def test_binding_create_get_delete_queue(broker, clients):
    x, q = clients.track_exchange(_name("bx")), clients.track_queue(_name("bq"))
    _, ch = clients.channel()
    ch.exchange_declare(x, "headers")
    ch.queue_declare(q)
    base = f"/api/bindings/%2F/e/{x}/q/{q}"
    status, _, headers = http_call(broker, "POST", base, {"routing_key": "rk", "arguments": {}})
    assert status == 201 and headers["Location"].endswith(f"/e/{x}/q/{q}/rk")
    status, _, headers = http_call(broker, "POST", base, {"routing_key": "rk", "arguments": {"x-match": "any",
                                                                                          "a": "1"}})
    assert status == 201
    with_args_key = headers["Location"].rsplit("/", 1)[1]
    assert with_args_key.startswith("rk~")
    status, body, _ = http_call(broker, "GET", base)
    assert sorted(b["properties_key"] for b in body) == sorted(["rk", with_args_key.replace("%7E", "~")])
    status, body, _ = http_call(broker, "GET", f"{base}/{with_args_key}")
    assert status == 200 and body["arguments"] == {"x-match": "any", "a": "1"}
    ch.basic_publish(x, "", b"h", properties=__import__("pika").BasicProperties(headers={"a": "1"}))
    assert ch.basic_get(q, auto_ack=True)[2] == b"h"
    assert http_call(broker, "DELETE", f"{base}/{with_args_key}")[0] == 204
    assert http_call(broker, "GET", f"{base}/{with_args_key}")[0] == 404
    status, body, _ = http_call(broker, "GET", f"/api/queues/%2F/{q}/bindings")
    assert sorted((b["source"], b["routing_key"]) for b in body) == [("", q), (x, "rk")]
    assert http_call(broker, "DELETE", f"{base}/rk")[0] == 204
    status, body, _ = http_call(broker, "GET", "/api/bindings/%2F")
    assert not [b for b in body if b["source"] == x]
    assert http_call(broker, "POST", f"/api/bindings/%2F/e/{x}/q/no-such-{q}", {})[0] == 404


def test_binding_exchange_to_exchange(broker, clients):
    src, dst, q = (clients.track_exchange(_name("s")), clients.track_exchange(_name("d")),
                   clients.track_queue(_name("q")))
    _, ch = clients.channel()
    ch.exchange_declare(src, "direct")
    ch.exchange_declare(dst, "fanout")
    ch.queue_declare(q)
    ch.queue_bind(q, dst)
    base = f"/api/bindings/%2F/e/{src}/e/{dst}"
    assert http_call(broker, "POST", base, {"routing_key": "go"})[0] == 201
    ch.basic_publish(src, "go", b"through")
    assert ch.basic_get(q, auto_ack=True)[2] == b"through"
    status, body, _ = http_call(broker, "GET", base)
    assert [(b["routing_key"], b["destination_type"]) for b in body] == [("go", "exchange")]
    assert http_call(broker, "DELETE", f"{base}/go")[0] == 204
    assert http_call(broker, "GET", base)[1] == []
