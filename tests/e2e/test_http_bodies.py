"""What an HTTP API request's body can make the broker hold: credentials first, then at most
``management_max_body_size`` bytes (RabbitMQ's management.http.max_body_size, 20 MiB), as RabbitMQ."""

from __future__ import annotations

import base64
import socket
from urllib.parse import urlsplit

from lavinpy.config import Config

from .conftest import http_call, lavinpy_only

pytestmark = lavinpy_only("management API of a lavinpy started by the tests")

LIMIT = Config().management_max_body_size


def _padded(size: int) -> bytes:
    """A definitions document of exactly ``size`` bytes (trailing white space)."""
    doc = b'{"vhosts": []}'
    return doc + b" " * (size - len(doc))


def test_a_body_over_the_limit_is_refused_with_400_and_one_at_it_is_read(broker):
    status, body, _ = http_call(broker, "POST", "/api/definitions", raw=_padded(LIMIT + 1))
    assert status == 400 and body["error"] == "bad_request"
    assert "Exceeded HTTP request body size limit" in body["reason"]
    assert "management_max_body_size" in body["reason"]  # the setting to raise is named
    status, _, _ = http_call(broker, "POST", "/api/definitions", raw=_padded(LIMIT))
    assert status in (200, 201, 204)


def _answer_to_headers_alone(broker, authorization: str | None) -> bytes:
    """The status line the broker sends to a POST announcing a 1 GiB body of which nothing is sent."""
    url = urlsplit(broker.http_url)
    head = ("POST /api/definitions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {1 << 30}\r\n")
    if authorization:
        head += f"Authorization: {authorization}\r\n"
    with socket.create_connection((url.hostname, url.port), timeout=10) as s:
        s.sendall(head.encode() + b"\r\n")
        return s.recv(4096).split(b"\r\n", 1)[0]


def test_credentials_are_checked_before_any_body_is_read(broker):
    """A stranger's upload is answered 401 before a byte of its body arrives: nothing of it is held."""
    assert b" 401 " in _answer_to_headers_alone(broker, None)
    wrong = "Basic " + base64.b64encode(b"guest:wrong").decode()
    assert b" 401 " in _answer_to_headers_alone(broker, wrong)
