"""PROXY protocol v1 and v2 from proxy_protocol_trusted_sources on AMQP, AMQPS and HTTP(S): the
header's client is the connection's address everywhere (listing, loopback-only guest); a trusted
source without a valid header, and anybody else sending one, is bad input (closed, logged, limited).
A relay in the test plays the load balancer so the client address can be any we choose."""

from __future__ import annotations

import base64
import json
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

from lavinpy.wire.constants import PROTOCOL_HEADER
from lavinpy.wire.proxy_header import V2_SIGNATURE, format_proxy_line, format_proxy_v2
from tests.helpers import free_port

from .conftest import LocalBroker, lavinpy_only, port_open
from .proxy_relay import Relay
from .tls_certs import CA

pytestmark = lavinpy_only("starts lavinpy with its own PROXY protocol settings")

REMOTE = ("203.0.113.9", 40001)  # a documentation address: never this machine's
FORMATS = {"v1": format_proxy_line, "v2": format_proxy_v2}


def _auth(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


class ProxiedBroker:
    """Trusts 127.0.0.1 only: every local connection must come through a relay (or be refused)."""

    def __init__(self, tmp_path: Path) -> None:
        self.ca = CA(tmp_path / "pki")
        cert, key, _ = self.ca.issue("server", server=True)
        self.amqps_port, self.https_port = free_port(), free_port()
        conf = tmp_path / "proxy.yaml"
        conf.write_text(f"proxy_protocol_trusted_sources: [127.0.0.1]\ntls_cert: {cert}\ntls_key: {key}\n"
                        f"amqps_port: {self.amqps_port}\nhttps_port: {self.https_port}\nprometheus_tls_port: 0\n")
        self.broker = LocalBroker(tmp_path / "broker")
        self.broker.extra_args = ["--config", str(conf)]
        self.broker.start()
        deadline = time.monotonic() + 10
        while not port_open("127.0.0.1", self.https_port):
            assert time.monotonic() < deadline, self.broker.log[-3000:]
            time.sleep(0.05)
        self.relays: list[Relay] = []

    def relay(self, port: int, version: str, source: tuple[str, int] | None = None) -> int:
        """A relay to ``port`` whose header names ``source`` (default: the relay's own client)."""
        def header(client: tuple[str, int]) -> bytes:
            return FORMATS[version](source or client, ("127.0.0.1", port))
        relay = Relay(("127.0.0.1", port), header)
        self.relays.append(relay)
        return relay.port

    def api(self, method: str, path: str, body: object = None, *, port: int | None = None,
            user: str = "guest", password: str = "guest") -> tuple[int, object]:
        """The API through a v2 relay naming the loopback client (guest may log in)."""
        port = port or self.relay(self.broker.http_port, "v2")
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                         headers={**_auth(user, password), "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                raw = response.read()
                return response.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as e:
            return e.code, None

    def close(self) -> None:
        for relay in self.relays:
            relay.close()
        self.broker.close()


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[ProxiedBroker]:
    b = ProxiedBroker(tmp_path)
    status, _ = b.api("PUT", "/api/users/remote", {"password": "secret", "tags": "administrator"})
    assert status in (201, 204)
    status, _ = b.api("PUT", "/api/permissions/%2F/remote", {"configure": ".*", "write": ".*", "read": ".*"})
    assert status in (201, 204)
    yield b
    b.close()


def _connections(b: ProxiedBroker) -> list[dict]:
    status, body = b.api("GET", "/api/connections")
    assert status == 200
    return body  # type: ignore[return-value]


def _wait_for_connection(b: ProxiedBroker, name: str) -> dict:
    deadline = time.monotonic() + 10
    while True:
        mine = [c for c in _connections(b) if c.get("client_properties", {}).get("connection_name") == name]
        if mine:
            return mine[0]
        assert time.monotonic() < deadline, f"no connection named {name}"
        time.sleep(0.05)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_amqp_client_address_is_the_headers(proxied: ProxiedBroker, version: str) -> None:
    port = proxied.relay(proxied.broker.port, version, REMOTE)
    params = pika.ConnectionParameters("127.0.0.1", port, credentials=pika.PlainCredentials("remote", "secret"),
                                       client_properties={"connection_name": f"remote-{version}"})
    connection = pika.BlockingConnection(params)
    try:
        listed = _wait_for_connection(proxied, f"remote-{version}")
        assert (listed["peer_host"], listed["peer_port"]) == REMOTE
        assert listed["port"] == proxied.broker.port
    finally:
        connection.close()
    # guest may log in only from loopback: the header says 203.0.113.9, the socket's 127.0.0.1 does not count.
    guest = pika.ConnectionParameters("127.0.0.1", port, credentials=pika.PlainCredentials("guest", "guest"),
                                      connection_attempts=1)
    with pytest.raises(pika.exceptions.ProbableAuthenticationError, match="can only connect via localhost"):
        pika.BlockingConnection(guest)


def test_amqps_after_a_v2_header(proxied: ProxiedBroker) -> None:
    port = proxied.relay(proxied.amqps_port, "v2", REMOTE)
    ctx = ssl.create_default_context(cafile=str(proxied.ca.cert_path))
    params = pika.ConnectionParameters("127.0.0.1", port, credentials=pika.PlainCredentials("remote", "secret"),
                                       ssl_options=pika.SSLOptions(ctx, "localhost"),
                                       client_properties={"connection_name": "remote-tls"})
    connection = pika.BlockingConnection(params)
    try:
        listed = _wait_for_connection(proxied, "remote-tls")
        assert (listed["peer_host"], listed["peer_port"]) == REMOTE and listed["ssl"] is True
    finally:
        connection.close()


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_http_loopback_rule_reads_the_headers_client(proxied: ProxiedBroker, version: str) -> None:
    remote = proxied.relay(proxied.broker.http_port, version, REMOTE)
    assert proxied.api("GET", "/api/whoami", port=remote)[0] == 401
    assert proxied.api("GET", "/api/whoami", port=remote, user="remote", password="secret")[0] == 200
    local = proxied.relay(proxied.broker.http_port, version)
    status, body = proxied.api("GET", "/api/whoami", port=local)
    assert status == 200 and body["name"] == "guest"  # type: ignore[index]


def test_https_after_a_v1_header(proxied: ProxiedBroker) -> None:
    port = proxied.relay(proxied.https_port, "v1", REMOTE)
    request = urllib.request.Request(f"https://localhost:{port}/api/whoami", headers=_auth("guest", "guest"))
    ctx = ssl.create_default_context(cafile=str(proxied.ca.cert_path))
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, context=ctx, timeout=10)
    assert refused.value.code == 401


def _answer(source: str, port: int, data: bytes) -> bytes:
    sock = socket.socket()
    sock.bind((source, 0))
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    sock.sendall(data)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    sock.close()
    return received


def test_bad_input_is_closed_and_logged(proxied: ProxiedBroker) -> None:
    amqp, http = proxied.broker.port, proxied.broker.http_port
    # A trusted source must send a header, and a valid one.
    assert _answer("127.0.0.1", amqp, PROTOCOL_HEADER) == b""
    assert _answer("127.0.0.1", amqp, V2_SIGNATURE + b"\x21\x11\x00\x04abcd" + PROTOCOL_HEADER) == b""
    assert _answer("127.0.0.1", amqp, b"PROXY TCP4 1.2.3.4\r\n" + PROTOCOL_HEADER) == b""
    assert _answer("127.0.0.1", http, b"GET /api/overview HTTP/1.1\r\nHost: x\r\n\r\n") == b""
    # Anybody else: a header is refused (AMQP answers as to any bad protocol header, HTTP with 400);
    # without one the same peer is served.
    stranger = "127.0.0.2"
    header = format_proxy_v2(REMOTE, ("127.0.0.1", amqp))
    assert _answer(stranger, amqp, header + PROTOCOL_HEADER) == PROTOCOL_HEADER
    assert _answer(stranger, amqp, format_proxy_line(REMOTE, ("127.0.0.1", amqp)) + PROTOCOL_HEADER) \
        == PROTOCOL_HEADER
    reply = _answer(stranger, http, header + b"GET /api/overview HTTP/1.1\r\nHost: x\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 400 ")
    sock = socket.socket()
    sock.bind((stranger, 0))
    sock.settimeout(10)
    sock.connect(("127.0.0.1", amqp))
    sock.sendall(PROTOCOL_HEADER)
    assert sock.recv(1) == b"\x01"  # connection.start
    sock.close()
    log = proxied.broker.log
    assert "a trusted source must start with a PROXY header" in log
    assert "not in proxy_protocol_trusted_sources" in log


def test_refusals_are_rate_limited_in_the_log(proxied: ProxiedBroker) -> None:
    before = proxied.broker.log.count("lavinpy.proxy")
    for _ in range(60):
        _answer("127.0.0.2", proxied.broker.port, b"PROXY UNKNOWN\r\n" + PROTOCOL_HEADER)
    time.sleep(0.5)
    logged = proxied.broker.log.count("lavinpy.proxy") - before
    assert 1 <= logged <= 25, logged


def _failed_login_seconds(port: int) -> float:
    params = pika.ConnectionParameters("127.0.0.1", port, connection_attempts=1, socket_timeout=10,
                                       credentials=pika.PlainCredentials("remote", "wrong"))
    started = time.monotonic()
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        pika.BlockingConnection(params)
    return time.monotonic() - started


def test_login_throttle_counts_the_headers_client(proxied: ProxiedBroker) -> None:
    guesser = proxied.relay(proxied.broker.port, "v2", ("198.51.100.7", 50000))
    bystander = proxied.relay(proxied.broker.port, "v2", ("198.51.100.8", 50000))
    for _ in range(6):  # 3 free failures, then 0.1 s doubling
        _failed_login_seconds(guesser)
    assert _failed_login_seconds(guesser) >= 0.7  # 0.8 s: slowed, by the header's address
    # Everything came from 127.0.0.1 on the wire; another client behind the same balancer is not slowed.
    assert _failed_login_seconds(bystander) < 0.5
    assert "198.51.100.7" in proxied.broker.log


def test_without_trusted_sources_every_header_is_refused(tmp_path: Path) -> None:
    broker = LocalBroker(tmp_path / "plain")
    broker.start()
    try:
        header = format_proxy_v2(REMOTE, ("127.0.0.1", broker.port))
        assert _answer("127.0.0.1", broker.port, header + PROTOCOL_HEADER) == PROTOCOL_HEADER
        assert _answer("127.0.0.1", broker.http_port, b"PROXY UNKNOWN\r\nGET / HTTP/1.1\r\n\r\n") \
            .startswith(b"HTTP/1.1 400 ")
        assert broker.log.count("not in proxy_protocol_trusted_sources") == 2
    finally:
        broker.close()


def test_a_health_check_from_a_trusted_source_is_not_bad_input(proxied: ProxiedBroker) -> None:
    before = proxied.broker.log.count("lavinpy.proxy")
    for _ in range(5):  # connect and close, as a balancer's TCP check does
        socket.create_connection(("127.0.0.1", proxied.broker.port), timeout=10).close()
    _answer("127.0.0.1", proxied.broker.port, PROTOCOL_HEADER)  # this one is bad input, and logged
    deadline = time.monotonic() + 5
    while proxied.broker.log.count("lavinpy.proxy") == before:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert proxied.broker.log.count("lavinpy.proxy") == before + 1


def test_a_header_before_tls_from_elsewhere_is_refused_and_logged(proxied: ProxiedBroker) -> None:
    for port, what in ((proxied.amqps_port, "AMQPS"), (proxied.https_port, "HTTPS")):
        assert _answer("127.0.0.2", port, format_proxy_v2(REMOTE, ("127.0.0.1", port))) == b""
        deadline = time.monotonic() + 5
        while f"{what} connection from 127.0.0.2" not in proxied.broker.log:
            assert time.monotonic() < deadline, proxied.broker.log[-2000:]
            time.sleep(0.05)
    # The same peer's TLS clients are served.
    ctx = ssl.create_default_context(cafile=str(proxied.ca.cert_path))
    stranger = ("127.0.0.2", 0)  # 127.0.0.1 is trusted and would have to send a header
    with socket.create_connection(("127.0.0.1", proxied.amqps_port), timeout=10, source_address=stranger) as raw, \
            ctx.wrap_socket(raw, server_hostname="localhost") as tls:
        assert tls.version() in ("TLSv1.2", "TLSv1.3")
