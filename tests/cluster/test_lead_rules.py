"""Who may lead (F7, F10): a copy half-way through a sync or an unsynced leader's after a machine
restart never leads; with the ISR gone from etcd no node leads until an operator forces one with
``lavinpyctl force_leader``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pika
import pytest

from tests.helpers import wait_until

from .harness import PREFIX, REPO_ROOT, SHORT_LEASE, Cluster
from .replication_harness import pause


def _isr(cluster: Cluster) -> list[str]:
    value = cluster.etcd.get(f"{PREFIX}/isr")
    return json.loads(value[0]) if value else []


def _start_in_sync(cluster: Cluster):
    nodes = cluster.start(2, SHORT_LEASE)
    leader = cluster.wait_for_leader(30)
    follower = next(n for n in nodes if n is not leader)
    wait_until(lambda: set(_isr(cluster)) == {n.node_id for n in nodes}, 30, what="both nodes in the ISR")
    connection = pika.BlockingConnection(pika.URLParameters(leader.amqp_url))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("kept", durable=True)
    channel.basic_publish("", "kept", b"confirmed", pika.BasicProperties(delivery_mode=2))
    connection.close()
    return leader, follower


def _force(cluster: Cluster, node_id: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lavinpy.cli.ctl", "force_leader", node_id,
                           "--etcd-endpoints", cluster.etcd.endpoint, "--etcd-prefix", PREFIX],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("state", [{"state": "syncing"}, {"state": "unsynced", "boot_id": "an-earlier-boot"}])
def test_a_copy_that_is_not_consistent_never_leads(cluster: Cluster, state: dict) -> None:
    leader, follower = _start_in_sync(cluster)
    leader.kill()
    follower.kill()  # etcd still lists both as in sync
    (follower.data_dir / ".replica_state").write_text(json.dumps(state))
    follower.start()
    wait_until(lambda: "may not lead" in follower.log_text(), 20, what="the follower to refuse to lead")
    wait_until(lambda: cluster.leader_key() is None, 15, what="the killed leader's lease to run out")
    time.sleep(2)
    assert cluster.leader_key() is None
    leader.start()  # the consistent copy comes back and leads; the other syncs from it
    assert cluster.wait_for_leader(30) is leader
    wait_until(lambda: set(_isr(cluster)) == {leader.node_id, follower.node_id}, 30, what="the follower in sync")


def test_without_the_isr_no_node_leads_until_an_operator_forces_one(cluster: Cluster) -> None:
    leader, follower = _start_in_sync(cluster)
    # The leader stopped first: alive, it may still record the epoch its last publish stamped, and that
    # writes the ISR again (a write already sent lands while the process stands still).
    pause(leader.process.pid)
    time.sleep(0.5)
    cluster.etcd.etcdctl("del", f"{PREFIX}/isr")
    leader.kill()
    wait_until(lambda: "etcd holds no ISR" in follower.log_text(), 20, what="the follower to refuse to lead")
    wait_until(lambda: cluster.leader_key() is None, 15, what="the killed leader's lease to run out")
    time.sleep(2)
    assert cluster.leader_key() is None

    refused = _force(cluster, "no-such-node")
    assert refused.returncode != 0 and "no live node" in refused.stderr
    done = _force(cluster, follower.node_id)
    assert done.returncode == 0, done.stderr
    assert cluster.wait_for_leader(20) is follower
    assert cluster.etcd.get(f"{PREFIX}/force_leader") is None  # consumed by the election
    assert _isr(cluster) == [follower.node_id] or follower.node_id in _isr(cluster)
    connection = pika.BlockingConnection(pika.URLParameters(follower.amqp_url))
    assert connection.channel().queue_declare("kept", durable=True, passive=True).method.message_count == 1
    connection.close()


def test_a_data_dir_restored_from_an_old_backup_never_leads(cluster: Cluster) -> None:
    leader, follower = _start_in_sync(cluster)
    follower.terminate()
    backup = follower.directory / "backup"
    shutil.copytree(follower.data_dir, backup)
    follower.start()
    wait_until(lambda: follower.node_id in _isr(cluster), 30, what="the follower back in the ISR")
    recorded = _recorded_epoch(cluster)
    connection = pika.BlockingConnection(pika.URLParameters(leader.amqp_url))
    channel = connection.channel()
    channel.confirm_delivery()
    deadline = time.monotonic() + 4  # epochs are stamped every second while the stream moves
    while time.monotonic() < deadline:
        channel.basic_publish("", "kept", b"later", pika.BasicProperties(delivery_mode=2))
    connection.close()
    wait_until(lambda: _recorded_epoch(cluster) > recorded, 10, what="a newer epoch recorded in etcd")
    leader.kill()
    follower.kill()
    shutil.rmtree(follower.data_dir)
    shutil.move(backup, follower.data_dir)
    follower.start()
    wait_until(lambda: "a restored backup?" in follower.log_text(), 25, what="the restored copy to refuse to lead")
    wait_until(lambda: cluster.leader_key() is None, 15, what="the killed leader's lease to run out")
    time.sleep(2)
    assert cluster.leader_key() is None
    leader.start()
    assert cluster.wait_for_leader(30) is leader


def _recorded_epoch(cluster: Cluster) -> int:
    value = cluster.etcd.get(f"{PREFIX}/isr_epoch")
    return int(value[0]) if value else 0


def test_an_fsync_never_leader_marks_its_copy_unsynced_and_a_clean_stop_keeps_its_epoch(cluster: Cluster) -> None:
    nodes = cluster.start(2, ["--fsync", "never"])
    leader = cluster.wait_for_leader(30)
    wait_until(lambda: set(_isr(cluster)) == {n.node_id for n in nodes}, 30, what="both nodes in the ISR")
    connection = pika.BlockingConnection(pika.URLParameters(leader.amqp_url))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("kept", durable=True)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        channel.basic_publish("", "kept", b"m", pika.BasicProperties(delivery_mode=2))
    connection.close()
    wait_until(lambda: _recorded_epoch(cluster) > 0, 10, what="an epoch recorded in etcd")
    state = json.loads((leader.data_dir / ".replica_state").read_text())
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert state["state"] == "unsynced" and state["boot_id"] == boot_id  # a machine crash would lose it
    recorded = _recorded_epoch(cluster)
    leader.terminate()
    state = json.loads((leader.data_dir / ".replica_state").read_text())
    assert state["state"] == "consistent" and state["epoch"] >= recorded
