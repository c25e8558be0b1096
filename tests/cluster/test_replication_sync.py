"""Full sync: a follower copies a data dir of 1M queued messages in 100 queues byte for byte, and a
broker opened on the copy (a promoted follower) has the same queues and counts."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from lavinpy import config as config_module
from lavinpy.broker.broker import Broker

from .replication_harness import Leader, replicated_hashes, start_follower, stop_process

pytestmark = pytest.mark.timeout(180)

QUEUES = 100
PER_QUEUE = 10_000
PERSISTENT = b"\x10\x00\x02"  # properties: delivery_mode = 2


def open_broker(data_dir: Path) -> Broker:
    broker = Broker(config_module.load(None, env={}, overrides={"data_dir": str(data_dir)}))
    broker.open()
    return broker


def fill(data_dir: Path) -> None:
    """1M persistent messages in 100 durable queues, written through the store API."""
    broker = open_broker(data_dir)
    try:
        vhost = broker.vhosts["/"]
        indexes = []
        for i in range(QUEUES):
            vhost.declare_queue(f"queue-{i:03d}", owner=None, durable=True)
            indexes.append(vhost.queues[f"queue-{i:03d}"].index)
        append = vhost.store.messages.append
        for n in range(PER_QUEUE):
            body = n.to_bytes(4, "little") * 4
            for i, index in enumerate(indexes):
                index.push(append("", f"queue-{i:03d}", PERSISTENT, body, 0))
    finally:
        broker.close()


def counts(broker: Broker) -> dict[str, int]:
    return {name: q.message_count for name, q in broker.vhosts["/"].queues.items()}


def test_full_sync_of_a_million_messages_is_byte_equal(tmp_path: Path) -> None:
    leader_dir, follower_dir = tmp_path / "leader", tmp_path / "follower"
    started = time.monotonic()
    fill(leader_dir)
    filled = time.monotonic()
    # The follower has a stale file the leader lacks, and a damaged copy of one the leader has.
    (follower_dir / "stale-vhost").mkdir(parents=True)
    (follower_dir / "stale-vhost" / "msgs.0000000001").write_bytes(b"stale")
    (follower_dir / "users.json").write_bytes(b"[]")

    leader = Leader(leader_dir).start()
    try:
        leader_counts = leader.call(lambda: _counts(leader))
        assert leader_counts == {f"queue-{i:03d}": PER_QUEUE for i in range(QUEUES)}
        follower = start_follower(follower_dir, leader.replication.port)
        try:
            leader.wait_caught_up("follower", timeout=120)
            synced = time.monotonic()
            assert leader.isr.members == ["leader", "follower"]
        finally:
            output = stop_process(follower)
        assert "Traceback" not in output, output
        leader_hashes = replicated_hashes(leader_dir)
        assert replicated_hashes(follower_dir) == leader_hashes
        assert sum(1 for rel in leader_hashes if "/msgs." in rel) >= 5
        assert not (follower_dir / "stale-vhost").exists()
    finally:
        leader.stop()
    print(f"fill {filled - started:.1f} s, full sync {synced - filled:.1f} s")
    promoted = open_broker(follower_dir)
    try:
        assert counts(promoted) == leader_counts
        # and the messages are readable
        queue = promoted.vhosts["/"].queues["queue-042"]
        first = promoted.vhosts["/"].store.messages.read(queue.index.peek())
        assert first.body == (0).to_bytes(4, "little") * 4
    finally:
        promoted.close()


async def _counts(leader: Leader) -> dict[str, int]:
    assert leader.server is not None
    return counts(leader.server.broker)
