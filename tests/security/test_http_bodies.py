"""Bodies at the HTTP face that no client library sends: JSON nested deeper than the decoder's
recursion limit, arguments and headers nested deeper than an AMQP field table may (``MAX_DEPTH``), and
message properties out of their field's range. Each is a 400 with RabbitMQ's error JSON naming the
problem (they were 500s with a traceback in the log); nothing is made, and the broker goes on. Requests
aiohttp cannot parse, and bodies cut short, leave no traceback, and a cut-short body's bytes are freed."""

from __future__ import annotations

import socket
import time
import urllib.parse
import uuid

from lavinpy.wire.field_table import MAX_DEPTH
from tests.e2e.conftest import http_call

from .conftest import rss_mib


def _nested(depth: int) -> dict:
    """A dict holding dicts ``depth`` levels down, counting itself."""
    value: dict = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def _refused(reply: tuple, what: str, text: str) -> None:
    status, body, _ = reply
    assert status == 400, (what, status, body)
    assert body["error"] == "bad_request" and text in body["reason"], (what, body)


def _publish(properties: dict) -> tuple[str, str, dict]:
    return ("POST", "/api/exchanges/%2F/amq.default/publish",
            {"routing_key": "nowhere", "payload": "x", "payload_encoding": "string", "properties": properties})


def test_json_nested_past_the_decoder_is_a_400(broker):
    deep = b"[" * 100_000 + b"]" * 100_000
    for path in ("/api/queues/%2F/deep-json", "/api/definitions", "/api/global-parameters/deep-json"):
        method = "POST" if path == "/api/definitions" else "PUT"
        _refused(http_call(broker, method, path, raw=deep, headers={"Content-Type": "application/json"}),
                 path, "nested too deeply")
    assert http_call(broker, "GET", "/api/queues/%2F/deep-json")[0] == 404
    assert "Traceback" not in broker.log


def test_arguments_and_headers_nest_no_deeper_than_an_amqp_table(broker):
    queue = f"q-{uuid.uuid4().hex[:8]}"
    assert http_call(broker, "PUT", f"/api/queues/%2F/{queue}", {})[0] == 201
    # The arguments table is level 1, so a value MAX_DEPTH levels deep is one too many; at 500 the
    # steps after the JSON decoder ran out of Python's recursion limit.
    for depth_of_value in (MAX_DEPTH, 500):
        too_deep = {"x-custom": _nested(depth_of_value)}
        cases = {
            "queue": ("PUT", f"/api/queues/%2F/{queue}-deep", {"arguments": too_deep}),
            "exchange": ("PUT", f"/api/exchanges/%2F/{queue}-deep", {"type": "direct", "arguments": too_deep}),
            "binding": ("POST", f"/api/bindings/%2F/e/amq.direct/q/{queue}",
                        {"routing_key": "k", "arguments": too_deep}),
            "definitions": ("POST", "/api/definitions",
                            {"queues": [{"name": f"{queue}-imported", "vhost": "/", "durable": True,
                                         "auto_delete": False, "arguments": too_deep}]}),
            "publish headers": _publish({"headers": too_deep}),
        }
        for what, (method, path, body) in cases.items():
            _refused(http_call(broker, method, path, body), what, f"nested deeper than {MAX_DEPTH} levels")
    for name in (f"{queue}-deep", f"{queue}-imported"):
        assert http_call(broker, "GET", f"/api/queues/%2F/{name}")[0] == 404
    assert http_call(broker, "GET", f"/api/exchanges/%2F/{queue}-deep")[0] == 404
    assert [b for b in http_call(broker, "GET", f"/api/queues/%2F/{queue}/bindings")[1] if b["source"]] == []
    # At the limit, as from an AMQP client: accepted, and the message's headers come back whole.
    fits = {"x-custom": _nested(MAX_DEPTH - 1)}
    assert http_call(broker, "PUT", f"/api/queues/%2F/{queue}-fits", {"arguments": fits})[0] == 201
    method, path, body = _publish({"headers": fits})
    body["routing_key"] = queue
    assert http_call(broker, method, path, body)[:2] == (200, {"routed": True})
    status, got, _ = http_call(broker, "POST", f"/api/queues/%2F/{queue}/get",
                               {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"})
    assert status == 200 and got[0]["properties"]["headers"] == fits
    assert "Traceback" not in broker.log


def test_message_properties_out_of_range_are_a_400(broker):
    cases = {
        "priority 256": ({"priority": 256}, "priority must be an integer from 0 to 255"),
        "priority 99999": ({"priority": 99999}, "priority must be an integer from 0 to 255"),
        "priority -1": ({"priority": -1}, "priority must be an integer from 0 to 255"),
        "timestamp past year 9999": ({"timestamp": 10 ** 20}, "timestamp"),
        "timestamp before year 1": ({"timestamp": -10 ** 14}, "timestamp"),
    }
    for what, (properties, text) in cases.items():
        _refused(http_call(broker, *_publish(properties)), what, text)
    assert http_call(broker, *_publish({"priority": 255, "timestamp": 0}))[0] == 200
    assert "Traceback" not in broker.log


def _raw_http(broker, request: bytes, *, wait_reply: bool = True) -> bytes:
    url = urllib.parse.urlsplit(broker.http_url)
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(request)
        if not wait_reply:
            return b""
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
        return reply


def test_requests_aiohttp_cannot_parse_or_that_end_early_leave_no_traceback(broker):
    """A request line over 8190 bytes, a bad chunk size, and a client gone in the middle of its body:
    the first two get a 400; none writes a traceback (aiohttp logs the first two at ERROR with one,
    and the third was an internal error), so no client can fill the log with them."""
    assert _raw_http(broker, b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.0 400")
    bad_chunk = (b"PUT /api/queues/%2F/q HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
    assert _raw_http(broker, bad_chunk).startswith(b"HTTP/1.0 400")
    auth = b"Authorization: Basic Z3Vlc3Q6Z3Vlc3Q=\r\n"  # guest:guest
    _raw_http(broker, b"PUT /api/queues/%2F/q-early HTTP/1.1\r\nHost: x\r\n" + auth
              + b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{", wait_reply=False)
    deadline = time.monotonic() + 10
    while "q-early" not in broker.log and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "q-early" in broker.log  # one line says the body ended early
    assert http_call(broker, "GET", "/api/queues/%2F/q-early")[0] == 404
    assert "Traceback" not in broker.log and " ERROR " not in broker.log


def test_bodies_of_clients_gone_mid_request_are_freed(fresh_broker):
    """A client sends 60 MiB of a larger body and goes, three times: the broker's memory comes back
    each time (the body read so far stayed in a reference cycle until a full collection, and RSS grew
    by each one)."""
    url = urllib.parse.urlsplit(fresh_broker.http_url)
    head = (b"POST /api/exchanges/%2F/amq.default/publish HTTP/1.1\r\nHost: x\r\n"
            b"Authorization: Basic Z3Vlc3Q6Z3Vlc3Q=\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000000\r\n\r\n{\"payload\": \"")
    piece = b"a" * (1024 * 1024)
    before = rss_mib(fresh_broker.pid)
    for round_ in range(3):
        with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
            sock.sendall(head)
            for _ in range(60):
                sock.sendall(piece)
            time.sleep(0.3)  # read by the broker
        deadline = time.monotonic() + 10
        while rss_mib(fresh_broker.pid) - before > 40 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rss_mib(fresh_broker.pid) - before < 40, (round_, rss_mib(fresh_broker.pid), before)
    assert "Traceback" not in fresh_broker.log
