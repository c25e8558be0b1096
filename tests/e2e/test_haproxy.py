"""Behind a real HAProxy (Debian's haproxy, run by the test on a generated config): send-proxy (v1)
and send-proxy-v2 in front of AMQP and HTTP. The broker trusts only 127.0.0.1, where HAProxy connects
from; clients reach HAProxy on this machine's non-loopback address, which must then be the address the
broker sees: in the connection listing, and for guest, who may log in only from loopback."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

from tests.helpers import free_port, http_request

from .conftest import LocalBroker, lavinpy_only, port_open

pytestmark = [lavinpy_only("starts lavinpy with its own PROXY protocol settings"),
              pytest.mark.skipif(shutil.which("haproxy") is None, reason="Debian's haproxy is not installed")]

MODES = ("send-proxy", "send-proxy-v2")


def _outside_address() -> str | None:
    """This machine's address on its default route (no packet is sent), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("198.51.100.1", 9))
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") else address


class HAProxied:
    def __init__(self, tmp_path: Path) -> None:
        conf = tmp_path / "lavinpy.yaml"
        conf.write_text("proxy_protocol_trusted_sources: [127.0.0.1]\n")
        self.broker = LocalBroker(tmp_path / "broker")
        self.broker.extra_args = ["--config", str(conf)]
        self.broker.start()
        self.ports = {(face, mode): free_port() for face in ("amqp", "http") for mode in MODES}
        targets = {"amqp": self.broker.port, "http": self.broker.http_port}
        lines = ["global", "  maxconn 256", "defaults", "  mode tcp", "  timeout connect 5s",
                 "  timeout client 60s", "  timeout server 60s"]
        for (face, mode), port in self.ports.items():
            name = f"{face}_{mode.replace('-', '_')}"
            lines += [f"listen {name}", f"  bind 0.0.0.0:{port}", f"  server lavinpy 127.0.0.1:{targets[face]} {mode}"]
        self.config = tmp_path / "haproxy.cfg"
        self.config.write_text("\n".join(lines) + "\n")
        self.log = tmp_path / "haproxy.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(["haproxy", "-db", "-f", str(self.config)], stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not all(port_open("127.0.0.1", p) for p in self.ports.values()):
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.05)

    def api(self, host: str, mode: str, path: str, user: str = "guest", password: str = "guest",
            body: object = None, method: str = "GET") -> tuple[int, object]:
        status, payload, _ = http_request(f"http://{host}:{self.ports['http', mode]}", method, path, body,
                                          user=user, password=password, timeout=10)
        return status, payload

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self.broker.close()


@pytest.fixture
def haproxied(tmp_path: Path) -> Iterator[HAProxied]:
    h = HAProxied(tmp_path)
    yield h
    h.close()


@pytest.mark.parametrize("mode", MODES)
def test_clients_behind_haproxy_keep_their_address(haproxied: HAProxied, mode: str) -> None:
    outside = _outside_address()
    if outside is None:
        pytest.skip("this machine has no non-loopback address to reach HAProxy on")
    # From loopback through HAProxy guest may manage; from the outside address guest is refused.
    assert haproxied.api("127.0.0.1", mode, "/api/whoami")[0] == 200
    assert haproxied.api(outside, mode, "/api/whoami")[0] == 401
    status, _ = haproxied.api("127.0.0.1", mode, "/api/users/remote", body={"password": "secret",
                              "tags": "administrator"}, method="PUT")
    assert status in (201, 204)
    status, _ = haproxied.api("127.0.0.1", mode, "/api/permissions/%2F/remote", method="PUT",
                              body={"configure": ".*", "write": ".*", "read": ".*"})
    assert status in (201, 204)
    assert haproxied.api(outside, mode, "/api/whoami", "remote", "secret")[0] == 200

    amqp_port = haproxied.ports["amqp", mode]
    guest = pika.ConnectionParameters(outside, amqp_port, connection_attempts=1,
                                      credentials=pika.PlainCredentials("guest", "guest"))
    with pytest.raises(pika.exceptions.ProbableAuthenticationError, match="can only connect via localhost"):
        pika.BlockingConnection(guest)
    params = pika.ConnectionParameters(outside, amqp_port, credentials=pika.PlainCredentials("remote", "secret"),
                                       client_properties={"connection_name": mode})
    connection = pika.BlockingConnection(params)
    try:
        channel = connection.channel()
        channel.queue_declare("behind-haproxy")
        channel.basic_publish("", "behind-haproxy", b"through HAProxy")
        deadline = time.monotonic() + 10
        while True:
            status, listed = haproxied.api("127.0.0.1", mode, "/api/connections")
            mine = [c for c in listed or [] if c["client_properties"].get("connection_name") == mode]
            if mine:
                break
            assert time.monotonic() < deadline, listed
            time.sleep(0.05)
        assert mine[0]["peer_host"] == outside  # not 127.0.0.1, where HAProxy connects from
        assert mine[0]["port"] == amqp_port  # the address the client connected to, from the header
        method, _, body = channel.basic_get("behind-haproxy", auto_ack=True)
        assert body == b"through HAProxy"
    finally:
        connection.close()
    # Straight from 127.0.0.1 (trusted, but without a header) is refused.
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", haproxied.broker.port, connection_attempts=1))
