"""Fencing: a leader that loses its lease stops serving before a successor is elected; ISR writes of a
node that does not hold the leader key fail; a leader cut off from etcd steps down before its lease
could expire."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from pathlib import Path

import pytest

from lavinpy import config as settings
from lavinpy.cluster.errors import LeadershipLost
from lavinpy.cluster.etcd import EtcdClient
from lavinpy.cluster.node import ClusterNode
from tests.helpers import wait_until

from .harness import PREFIX, SHORT_LEASE, SHORT_LEASE_TTL, Cluster, Etcd


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(65536) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_revoked_leader_stops_serving_before_a_successor_is_elected(cluster: Cluster) -> None:
    cluster.start(3)
    leader = cluster.wait_for_leader(30)
    _, lease = cluster.leader_key()
    client = socket.create_connection(("127.0.0.1", leader.amqp_port))  # served by the leader itself
    client.sendall(b"AMQP\x00\x00\x09\x01")
    assert client.recv(1) == b"\x01"  # connection.start: the broker answers
    client.settimeout(0.3)
    with contextlib.suppress(TimeoutError):
        while client.recv(65536):  # the rest of connection.start: from now on a read sees only the close
            pass
    client.setblocking(False)

    cluster.etcd.etcdctl("lease", "revoke", format(lease, "x"))
    revoked_at = time.monotonic()
    closed_at = elected_at = None
    # Each time is taken just after the check that saw the event; closure is checked first.
    while time.monotonic() - revoked_at < 10 and (closed_at is None or elected_at is None):
        if closed_at is None and _closed(client):
            closed_at = time.monotonic()
        key = cluster.leader_key()
        if elected_at is None and key is not None and key[1] != lease:
            elected_at = time.monotonic()
        time.sleep(0.002)
    client.close()
    assert closed_at is not None, "the leader kept serving after its lease was revoked"
    assert elected_at is not None, "no successor was elected"
    print(f"old leader closed its clients {closed_at - revoked_at:.3f} s after the revocation, "
          f"successor elected after {elected_at - revoked_at:.3f} s")
    assert closed_at <= elected_at
    assert "lease is gone" in leader.log_text() or "leader key was deleted" in leader.log_text()
    cluster.wait_for_leader(20)  # and the cluster serves again


def test_isr_write_of_a_node_without_the_leader_key_fails(etcd: Etcd, tmp_path: Path) -> None:
    cfg = settings.load(env={}, overrides={"data_dir": str(tmp_path / "data"), "clustering": True,
                                           "clustering_etcd_endpoints": etcd.endpoint,
                                           "clustering_etcd_prefix": PREFIX})

    async def scenario() -> None:
        etcd_client = EtcdClient(etcd.endpoint)
        node = ClusterNode(cfg, start_leader=None, argv=[])  # not run: only its fenced ISR write is used
        node.id = "me"
        try:
            other = await etcd_client.lease_grant(30)
            await etcd_client.put(f"{PREFIX}/leader", "tcp://127.0.0.1:1", other)
            await etcd_client.put(f"{PREFIX}/isr", '["other"]')
            node.lease = await etcd_client.lease_grant(30)
            with pytest.raises(LeadershipLost):
                await node.write_isr(["me"])
            assert (await etcd_client.get(f"{PREFIX}/isr")).text == '["other"]'

            await etcd_client.lease_revoke(other)  # the leader key goes; this node takes it
            assert await etcd_client.put_if_absent(f"{PREFIX}/leader", node.uri, node.lease)
            await node.write_isr(["me", "x"])
            assert (await etcd_client.get(f"{PREFIX}/isr")).text == '["me", "x"]'

            await etcd_client.lease_revoke(node.lease)  # fenced out from now on
            with pytest.raises(LeadershipLost):
                await node.write_isr(["me"])
            assert (await etcd_client.get(f"{PREFIX}/isr")).text == '["me", "x"]'
        finally:
            await node.etcd.close()
            await etcd_client.close()
    asyncio.run(scenario())


def test_leader_cut_off_from_etcd_steps_down_before_its_lease_deadline(cluster: Cluster) -> None:
    (node,) = cluster.start(1, SHORT_LEASE)
    assert cluster.wait_for_leader(30) is node
    cluster.etcd.stop()
    stopped_at = time.monotonic()
    wait_until(lambda: not node.amqp_serves(0.5), SHORT_LEASE_TTL + 2, 0.1, "the leader to stop serving")
    down_after = time.monotonic() - stopped_at
    print(f"the leader stopped serving {down_after:.2f} s after etcd was stopped")
    # Its last keepalive came before etcd stopped, so its lease could run out SHORT_LEASE_TTL s after that.
    assert down_after < SHORT_LEASE_TTL
    assert "etcd unreachable" in node.log_text()
    time.sleep(1)
    assert not node.amqp_serves(0.5), "a node without etcd must not serve"

    cluster.etcd.start()  # etcd is back: the node (re-executed as a follower) leads again
    assert cluster.wait_for_leader(30) is node
