"""A real HAProxy (Debian's haproxy) in front of a follower, with send-proxy and send-proxy-v2: the
follower trusts 127.0.0.1 (where HAProxy connects from), takes the header and forwards the client HAProxy
named, so the leader lists and checks the client's own address. A PROXY header from any other peer of the
follower is bad input, refused by the follower itself; a trusted peer without a header is refused too."""

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

from tests.helpers import connect_from, free_port, http_request, read_all, wait_until

from .harness import Cluster, Node, port_open

pytestmark = pytest.mark.skipif(shutil.which("haproxy") is None, reason="Debian's haproxy is not installed")

MODES = ("send-proxy", "send-proxy-v2")
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
UNTRUSTED = "a PROXY header from a source not in proxy_protocol_trusted_sources"


def _outside_address() -> str | None:
    """This machine's address on its default route (no packet is sent), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("198.51.100.1", 9))
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") else address


def api(host: str, port: int, path: str, user: str = "guest", password: str = "guest",
        body: object = None, method: str = "GET") -> tuple[int, object]:
    status, payload, _ = http_request(f"http://{host}:{port}", method, path, body, user=user, password=password,
                                      timeout=10)
    return status, payload


class Setup:
    """A leader without trusted sources, a follower trusting 127.0.0.1, HAProxy in front of the follower."""

    def __init__(self, cluster: Cluster, tmp_path: Path) -> None:
        cluster.start(1)
        self.leader = cluster.wait_for_leader(30)
        self.follower: Node = cluster.add(1, ["--proxy-protocol-trusted-sources", "127.0.0.1"])[0]
        self.follower.start()
        wait_until(lambda: "forwarding HTTP" in self.follower.log_text(), 30, 0.1, "the follower listening")
        self.ports = {(face, mode): free_port() for face in ("amqp", "http") for mode in MODES}
        targets = {"amqp": self.follower.amqp_port, "http": self.follower.http_port}
        lines = ["global", "  maxconn 256", "defaults", "  mode tcp", "  timeout connect 5s",
                 "  timeout client 60s", "  timeout server 60s"]
        for (face, mode), port in self.ports.items():
            lines += [f"listen {face}_{mode.replace('-', '_')}", f"  bind 0.0.0.0:{port}",
                      f"  server follower 127.0.0.1:{targets[face]} {mode}"]
        config = tmp_path / "haproxy.cfg"
        config.write_text("\n".join(lines) + "\n")
        self.log = tmp_path / "haproxy.log"
        with open(self.log, "wb") as out:
            self.haproxy = subprocess.Popen(["haproxy", "-db", "-f", str(config)], stdout=out,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not all(port_open(p) for p in self.ports.values()):
            assert self.haproxy.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.05)
        # The follower listens before it knows the leader (until then it answers 503): wait for it to forward.
        wait_until(lambda: all(api("127.0.0.1", self.ports["http", mode], "/api/whoami")[0] == 200 for mode in MODES),
                   30, 0.1, "the follower forwarding to the leader")

    def close(self) -> None:
        self.haproxy.terminate()
        self.haproxy.wait(10)


@pytest.fixture
def setup(cluster: Cluster, tmp_path: Path) -> Iterator[Setup]:
    s = Setup(cluster, tmp_path)
    yield s
    s.close()


def _leader_lists(setup: Setup, name: str) -> dict:
    def listed() -> dict | None:
        _, connections = api("127.0.0.1", setup.leader.http_port, "/api/connections")
        return next((c for c in connections or [] if c["client_properties"].get("connection_name") == name), None)
    return wait_until(listed, 10, 0.05, f"the leader listing {name}")


def test_clients_behind_haproxy_and_a_follower_keep_their_address(setup: Setup) -> None:
    outside = _outside_address()
    if outside is None:
        pytest.skip("this machine has no non-loopback address to reach HAProxy on")
    status, _ = api("127.0.0.1", setup.leader.http_port, "/api/users/remote", method="PUT",
                    body={"password": "secret", "tags": "administrator"})
    assert status in (201, 204)
    status, _ = api("127.0.0.1", setup.leader.http_port, "/api/permissions/%2F/remote", method="PUT",
                    body={"configure": ".*", "write": ".*", "read": ".*"})
    assert status in (201, 204)
    for mode in MODES:
        http_port, amqp_port = setup.ports["http", mode], setup.ports["amqp", mode]
        # guest may log in from loopback only: the leader sees where the client really is.
        assert api("127.0.0.1", http_port, "/api/whoami")[0] == 200
        assert api(outside, http_port, "/api/whoami")[0] == 401
        assert api(outside, http_port, "/api/whoami", "remote", "secret")[0] == 200
        guest = pika.ConnectionParameters(outside, amqp_port, connection_attempts=1)
        with pytest.raises(pika.exceptions.ProbableAuthenticationError, match="can only connect via localhost"):
            pika.BlockingConnection(guest)
        connection = pika.BlockingConnection(pika.ConnectionParameters(
            outside, amqp_port, credentials=pika.PlainCredentials("remote", "secret"),
            client_properties={"connection_name": mode}))
        try:
            client = connection._impl._transport._sock.getsockname()
            listed = _leader_lists(setup, mode)
            assert (listed["peer_host"], listed["peer_port"]) == (client[0], client[1])
            assert listed["port"] == amqp_port  # the address the client connected to, from HAProxy's header
            channel = connection.channel()
            channel.queue_declare("behind-a-follower")
            channel.basic_publish("", "behind-a-follower", mode.encode())
            assert channel.basic_get("behind-a-follower", auto_ack=True)[2] == mode.encode()
        finally:
            connection.close()
    # A client behind the trusted HAProxy that sends a PROXY header of its own: bad input.
    sneaky = socket.create_connection((outside, setup.ports["amqp", "send-proxy"]), timeout=5)
    sneaky.sendall(b"PROXY TCP4 127.0.0.1 127.0.0.1 4242 5672\r\n" + PROTOCOL_HEADER)
    assert read_all(sneaky) == PROTOCOL_HEADER
    sneaky.close()


def test_proxy_header_from_an_untrusted_peer_of_a_follower_is_refused(setup: Setup) -> None:
    line = b"PROXY TCP4 192.0.2.7 127.0.0.1 4242 5672\r\n"
    follower, leader = setup.follower, setup.leader
    # 127.0.0.2 is not trusted by the follower: its header is refused there, answered as the leader would.
    stranger = connect_from("127.0.0.2", follower.amqp_port)
    stranger.sendall(line + PROTOCOL_HEADER)
    assert read_all(stranger) == PROTOCOL_HEADER
    stranger.close()
    stranger = connect_from("127.0.0.2", follower.http_port)
    stranger.sendall(line + b"GET /api/overview HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_all(stranger).split(b"\r\n", 1)[0] == b"HTTP/1.1 400 Bad Request"
    stranger.close()
    wait_until(lambda: follower.log_text().count("connection from 127.0.0.2:") >= 2, 10, 0.05, "the refusals logged")
    assert "AMQP connection from 127.0.0.2" in follower.log_text() and UNTRUSTED in follower.log_text()
    # 127.0.0.1 is trusted: without a header it is refused (the header is required), as on a single node.
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", follower.amqp_port, connection_attempts=1))
    wait_until(lambda: "a trusted source must start with a PROXY header" in follower.log_text(), 10, 0.05,
               "the missing header logged")
    # Nothing else is affected: the leader saw none of it, and a client through HAProxy is served.
    assert UNTRUSTED not in leader.log_text()
    for mode in MODES:
        connection = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", setup.ports["amqp", mode], client_properties={"connection_name": mode}))
        try:
            assert _leader_lists(setup, mode)["peer_host"] == "127.0.0.1"
            connection.channel().queue_declare("still-served", auto_delete=True)
        finally:
            connection.close()
    _, connections = api("127.0.0.1", leader.http_port, "/api/connections")
    assert not [c for c in connections or [] if c["peer_host"] in ("127.0.0.2", "192.0.2.7")]
