"""A cluster as it should run where strangers share the network: etcd with TLS, client certificates
and authentication (a lavinpy user allowed only under the cluster's prefix), and replication over TLS
with the nodes' certificates. Two nodes on one such etcd, started once for the module: they elect and
replicate through it, a message survives a failover, a token etcd revokes is replaced without a step
down, a peer without the secret cannot make the leader buffer a 64 MiB frame, and a node with a wrong
etcd password stops with a clear error."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import ssl
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from lavinpy.cluster import replication_protocol as proto
from lavinpy.cluster.etcd import EtcdClient, EtcdError
from lavinpy.cluster.replication_server import HANDSHAKE_TIMEOUT
from lavinpy.cluster.tls import etcd_context
from tests.e2e.tls_certs import encrypted
from tests.helpers import wait_until

from .certs import node_certificate
from .harness import PREFIX, REPO_ROOT, Cluster, Node, etcd_binary
from .secure_etcd import PASSWORD, USER, SecureEtcd

pytestmark = pytest.mark.timeout(240)

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def secure_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureEtcd]:
    if etcd_binary() is None:
        pytest.skip("the etcd binary is missing (Debian: apt-get install etcd-server etcd-client)")
    server = SecureEtcd(tmp_path_factory.mktemp("secure") / "etcd")
    server.start()
    try:
        server.enable_auth()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def trusted(secure_etcd: SecureEtcd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two nodes with etcd auth and TLS, and TLS on their replication port."""
    directory = tmp_path_factory.mktemp("trusted")
    cert, key = node_certificate(secure_etcd.ca, "node")
    settings = secure_etcd.node_settings(directory / "lavinpy.yaml", **_replication_tls(secure_etcd, cert, key))
    cluster = Cluster(directory / "nodes", secure_etcd)
    cluster.start(2, ["--config", str(settings)])
    try:
        yield cluster
    finally:
        cluster.stop_all()
        for node in cluster.nodes:
            print(f"--- {node.name}: last lines of its log ---\n" + "\n".join(node.log_text().splitlines()[-40:]))


def _replication_tls(etcd: SecureEtcd, cert: Path, key: Path) -> dict:
    # The node certificate serves the TLS ports too, which these tests turn off (fixed port numbers).
    return {"clustering_tls": True, "tls_cert": str(cert), "tls_key": str(key), "tls_ca_cert": str(etcd.ca.cert_path),
            "amqps_port": 0, "mqtts_port": 0, "https_port": 0, "prometheus_tls_port": 0}


def _isr(cluster: Cluster) -> list[str]:
    value = cluster.etcd.get(f"{PREFIX}/isr")
    return json.loads(value[0]) if value else []


def _in_sync(cluster: Cluster) -> bool:
    return {n.node_id for n in cluster.nodes if n.alive} <= set(_isr(cluster))


def test_elects_and_replicates_over_tls_through_etcd_with_auth_and_tls(trusted: Cluster) -> None:
    leader = trusted.wait_for_leader(40)
    (follower,) = [n for n in trusted.nodes if n is not leader]
    wait_until(lambda: _in_sync(trusted), 30, 0.2, "both nodes in the ISR")
    assert "(TLS)" in leader.log_text().rsplit("elected leader", 1)[-1]  # its replication listener
    # The secret is in etcd, readable by the cluster's user and root only.
    assert trusted.etcd.get(f"{PREFIX}/clustering_secret") is not None

    connection = pika.BlockingConnection(pika.URLParameters(leader.amqp_url))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("trusted", durable=True)
    channel.basic_publish("", "trusted", b"over TLS", pika.BasicProperties(delivery_mode=2))
    connection.close()

    leader.kill()  # the follower has the confirmed message: it came over TLS
    successor = trusted.wait_for_leader(30, exclude=leader)
    assert successor is follower
    connection = pika.BlockingConnection(pika.URLParameters(successor.amqp_url))
    _, _, body = connection.channel().basic_get("trusted", auto_ack=True)
    connection.close()
    assert body == b"over TLS"
    leader.start()  # back as a follower, for the next tests
    wait_until(lambda: _in_sync(trusted), 40, 0.2, "the old leader back in the ISR")


def test_a_token_etcd_revokes_is_replaced_without_a_step_down(trusted: Cluster) -> None:
    leader = trusted.wait_for_leader(40)
    key = trusted.leader_key()
    # A password change (here to the same password) makes etcd drop the user's tokens.
    trusted.etcd.etcdctl("user", "passwd", USER, "--interactive=false", stdin=PASSWORD + "\n")
    wait_until(lambda: all("authenticating again" in n.log_text() for n in trusted.nodes if n.alive), 10, 0.2,
               "every node to log in again")
    time.sleep(1.0)
    assert trusted.leader_key() == key
    assert trusted.leader() is leader and leader.amqp_serves(2)
    assert "stops leading" not in leader.log_text().rsplit("elected leader", 1)[-1]


def _rss(node: Node) -> int:
    assert node.process is not None
    for line in Path(f"/proc/{node.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _push(sock: socket.socket, data: bytes, seconds: float) -> int:
    """Bytes of ``data`` the peer took (in pieces) before it hung up or ``seconds`` passed."""
    sent = 0
    sock.settimeout(seconds)
    try:
        for offset in range(0, len(data), MiB):
            sock.sendall(data[offset:offset + MiB])
            sent += MiB
    except (OSError, ssl.SSLError):
        pass
    return sent


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        return sock.recv(4096) == b""
    except TimeoutError:
        return False
    except (ConnectionError, ssl.SSLError):
        return True


def test_an_unauthenticated_64_mib_frame_is_refused_at_once(trusted: Cluster) -> None:
    """A peer holding a certificate the CA signed, but not the shared secret, announces a 64 MiB frame:
    the leader closes the connection as the header arrives; its memory does not move."""
    leader = trusted.wait_for_leader(40)
    etcd = trusted.etcd
    assert isinstance(etcd, SecureEtcd)
    context = ssl.create_default_context(cafile=str(etcd.ca.cert_path))
    context.load_cert_chain(*map(str, node_certificate(etcd.ca, "intruder")))
    payload = bytes(32 * MiB)
    before = _rss(leader)
    # Timed from the connect, as the leader's handshake limit is: a leader that waited for the frame
    # would close the connection at that limit, after the connect plus the limit here; one that
    # refuses the header closes it well before on any machine (the TLS handshake included).
    started = time.monotonic()
    raw = socket.create_connection(("127.0.0.1", leader.clustering_port), timeout=5)
    with context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
        sock.sendall(struct.pack(">IB", 64 * MiB, proto.HELLO))
        # One thread only: an SSL socket written and read by two threads at once can crash OpenSSL. A
        # leader that hangs up makes the push fail at once; one that stops reading makes it time out.
        pushed = [_push(sock, payload, 3.0)]
        closed = _closed_within(sock, HANDSHAKE_TIMEOUT + 2)
        elapsed = time.monotonic() - started
    grown = _rss(leader) - before
    assert closed and elapsed < HANDSHAKE_TIMEOUT, f"closed: {closed} after {elapsed:.2f} s"
    assert pushed and pushed[0] < 16 * MiB, f"the leader took {pushed} bytes"
    assert grown < 8 * MiB, f"the leader's RSS grew {grown / MiB:.1f} MiB"
    # Without TLS (no certificate at all) the same bytes are refused by the TLS handshake.
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", leader.clustering_port), timeout=5) as plain:
        plain.sendall(struct.pack(">IB", 64 * MiB, proto.HELLO) + bytes(4096))
        assert _closed_within(plain, HANDSHAKE_TIMEOUT + 2)
    assert time.monotonic() - started < HANDSHAKE_TIMEOUT
    assert leader.alive and trusted.leader() is leader


@pytest.mark.parametrize("credentials", ["a wrong password", "no user"])
def test_a_node_etcd_refuses_stops_with_a_clear_error(secure_etcd: SecureEtcd, tmp_path: Path,
                                                      credentials: str) -> None:
    settings = secure_etcd.node_settings(tmp_path / "lavinpy.yaml", password="not-the-password")
    if credentials == "no user":
        values = json.loads(settings.read_text())
        del values["clustering_etcd_user"], values["clustering_etcd_password"]
        settings.write_text(json.dumps(values))
    cluster = Cluster(tmp_path / "nodes", secure_etcd)
    (node,) = cluster.start(1, ["--config", str(settings)])
    try:
        assert node.process is not None
        code = node.process.wait(30)
    finally:
        cluster.stop_all()
    text = node.log_text()
    assert code == 1, text[-2000:]
    if credentials == "a wrong password":
        expected = f"etcd refused user '{USER}': etcdserver: authentication failed, invalid user ID or password"
    else:
        expected = "etcd requires authentication (set clustering_etcd_user and clustering_etcd_password)"
    assert "cannot join the cluster: " in text and expected in text, text[-2000:]


def test_lavinpyctl_force_leader_reaches_etcd_with_auth_and_tls(trusted: Cluster) -> None:
    """An operator's command logs in as the nodes do (here naming no live node, so nothing changes)."""
    etcd = trusted.etcd
    assert isinstance(etcd, SecureEtcd)
    command = [sys.executable, "-m", "lavinpy.cli.ctl", "force_leader", "no-such-node", "--etcd-endpoints",
               etcd.endpoint, "--etcd-prefix", PREFIX, "--etcd-user", USER, "--etcd-tls-ca", str(etcd.ca.cert_path),
               "--etcd-tls-cert", str(etcd.client_cert), "--etcd-tls-key", str(etcd.client_key)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAVINPY_")}
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=30,
                          env={**env, "PYTHONPATH": str(REPO_ROOT), "LAVINPY_CLUSTERING_ETCD_PASSWORD": PASSWORD})
    live = sorted(n.node_id for n in trusted.nodes if n.alive)
    assert f"no live node 'no-such-node' under {PREFIX}/ (live: {', '.join(live)})" in done.stderr, done.stderr
    wrong = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=30,
                           env={**env, "PYTHONPATH": str(REPO_ROOT), "LAVINPY_CLUSTERING_ETCD_PASSWORD": "wrong"})
    assert "authentication failed" in wrong.stderr and wrong.returncode != 0


def test_the_etcd_client_needs_the_ca_and_its_certificate(secure_etcd: SecureEtcd) -> None:
    encrypted_key = encrypted(secure_etcd.client_key, "key pass")

    async def attempts() -> dict[str, str]:
        ca = str(secure_etcd.ca.cert_path)
        # One try each, so a budget a loaded machine cannot miss: the first request of a client is a TCP
        # connect, a TLS handshake and etcd's bcrypt check of the password (over 1 s at load 20-30), and
        # what is checked here is who gets an answer, not how soon (a refusal comes at once).
        budget = 20.0
        clients = {
            "all of it": EtcdClient(secure_etcd.endpoint, budget, user=USER, password=PASSWORD,
                                    tls=etcd_context(ca, str(secure_etcd.client_cert), str(secure_etcd.client_key))),
            "an encrypted key and its passphrase": EtcdClient(
                secure_etcd.endpoint, budget, user=USER, password=PASSWORD,
                tls=etcd_context(ca, str(secure_etcd.client_cert), str(encrypted_key), "key pass")),
            "no client certificate": EtcdClient(secure_etcd.endpoint, budget, user=USER, password=PASSWORD,
                                                tls=etcd_context(ca)),
            "plain HTTP": EtcdClient(secure_etcd.endpoint, budget, user=USER, password=PASSWORD),
            "outside its prefix": EtcdClient(secure_etcd.endpoint, budget, user=USER, password=PASSWORD,
                                             tls=etcd_context(ca, str(secure_etcd.client_cert),
                                                              str(secure_etcd.client_key))),
        }
        results = {}
        for name, client in clients.items():
            try:
                await client.get("other/key" if name == "outside its prefix" else f"{PREFIX}/clustering_secret")
                results[name] = "read"
            except EtcdError as e:
                results[name] = str(e)
            finally:
                await client.close()
        return results
    results = asyncio.run(attempts())
    assert results["all of it"] == "read", results
    assert results["an encrypted key and its passphrase"] == "read", results
    assert "certificate" in results["no client certificate"].lower(), results
    assert "no endpoint could serve" in results["plain HTTP"], results
    assert "permission denied" in results["outside its prefix"], results
