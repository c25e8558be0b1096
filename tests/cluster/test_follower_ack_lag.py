"""A follower syncs a queue's ack file later than the batch that appended to it: what a confirm needs
on every node that could be elected (the message and its enq entry) is synced with the batch, and an
ack lost in a crash of the follower only brings a redelivery once it is elected, never a loss.

The crash is modelled in this process: every fsync of a file under the follower's data dir records the
file's content, and the "power loss" image keeps, of each file the follower wrote, only what its last
fsync covered (a file never synced is gone)."""

from __future__ import annotations

import errno
import os
import shutil
import threading
from pathlib import Path

import pika
import pytest

from lavinpy.cluster import file_applier
from lavinpy.cluster import replication_protocol as proto
from lavinpy.cluster.file_applier import FileApplier, ReplicaDiskError, apply_batch
from lavinpy.store.datadir import sha1_name
from lavinpy.store.index_kinds import FIFO
from lavinpy.store.vhost_store import VhostStore

from .replication_harness import Leader
from .test_file_applier_faults import Follower, fd_path

pytestmark = pytest.mark.timeout(120)

REAL_FSYNC, REAL_REPLACE = os.fsync, os.replace
PERSISTENT = pika.BasicProperties(delivery_mode=2)
SEGMENT_SIZE = 64 * 1024


class SyncedContent:
    """What the disk would keep of the files under ``root`` after a power loss: each file's content as
    of its last fsync (os.fsync patched; a batch's files go through the thread-pool fsync_all)."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = root
        self.synced: dict[str, bytes] = {}
        self.fsyncs: list[str] = []  # paths relative to root, in order
        self._lock = threading.Lock()
        monkeypatch.setattr(file_applier, "fsync_all", file_applier.pool_fsync_all)
        monkeypatch.setattr(os, "fsync", self._fsync)
        monkeypatch.setattr(os, "replace", self._replace)

    def _rel(self, path: str) -> str | None:
        prefix = f"{self.root.resolve()}/"
        return path[len(prefix):] if path.startswith(prefix) else None

    def _fsync(self, fd: int) -> None:
        REAL_FSYNC(fd)
        rel = self._rel(fd_path(fd))
        if rel is not None and os.path.isfile(self.root / rel):
            with open(self.root / rel, "rb") as file, self._lock:
                self.synced[rel] = file.read()
                self.fsyncs.append(rel)

    def _replace(self, src: str | os.PathLike, dst: str | os.PathLike) -> None:
        REAL_REPLACE(src, dst)
        old, new = self._rel(os.path.abspath(src)), self._rel(os.path.abspath(dst))
        with self._lock:
            if old is not None and old in self.synced and new is not None:
                self.synced[new] = self.synced.pop(old)

    def power_loss_image(self, into: Path) -> None:
        """A copy of root as a power loss now would leave it: files written by the replication stream
        keep their synced content; the node's own state files (written by other code, synced there)
        are copied as they are."""
        shutil.copytree(self.root, into)
        with self._lock:
            synced = dict(self.synced)
        for path in into.rglob("*"):
            rel = path.relative_to(into).as_posix()
            if not path.is_file() or (path.name.startswith(".") and "/" not in rel):
                continue
            if rel in synced:
                path.write_bytes(synced[rel])
            else:
                path.unlink()


def queue_bodies(data_dir: Path, queue: str) -> list[bytes]:
    """Open the copy's store as an elected follower would and read the queue's messages in order."""
    store = VhostStore(data_dir / sha1_name("/"), segment_size=SEGMENT_SIZE, fsync="never")
    store.open()
    try:
        index = store.open_queue(queue, True, FIFO)
        store.finish_recovery()
        return [bytes(store.messages.read(pos).body) for pos in index]
    finally:
        store.close()


def test_an_elected_follower_that_lost_its_unsynced_acks_keeps_every_confirmed_unacked_message(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_applier, "ACK_SYNC_INTERVAL", 3600.0)  # acks synced only when cut or at the end
    follower_dir = tmp_path / "follower"
    disk = SyncedContent(follower_dir, monkeypatch)
    leader = Leader(tmp_path / "leader", segment_size=SEGMENT_SIZE).start()
    follower = Follower(follower_dir, leader.replication.port)
    try:
        leader.wait_caught_up("follower")
        connection = pika.BlockingConnection(pika.URLParameters(leader.url))
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("q", durable=True)
        for n in range(300):  # each confirmed: on the follower's disk before the confirm
            channel.basic_publish("", "q", f"m{n:03}".encode() * 100, PERSISTENT)
        for _ in range(100):
            method, _, _ = channel.basic_get("q")
            channel.basic_ack(method.delivery_tag)
        for n in range(300, 310):  # a confirm flush writes the acks too: they reach the follower
            channel.basic_publish("", "q", f"m{n:03}".encode() * 100, PERSISTENT)
        connection.close()
        leader.wait_caught_up("follower")
        image = tmp_path / "after-power-loss"
        disk.power_loss_image(image)  # while the follower still runs: as a crash would find it
        acks = [rel for rel in disk.fsyncs if rel.endswith("/ack")]
    finally:
        follower.stop()
        leader.stop()
    bodies = queue_bodies(image, "q")
    unacked = [f"m{n:03}".encode() * 100 for n in range(100, 310)]
    assert [b for b in bodies if b in unacked] == unacked  # every confirmed unacked message, in order
    assert not acks, f"an ack file was synced with a batch: {acks}"
    assert len(bodies) == 310  # the 100 acks were lost with the page cache: redelivered, not lost
    assert queue_bodies(follower_dir, "q") == unacked  # the follower's files as they are: acks there


def write(end: int, rel: str, data: bytes, offset: int = 0) -> proto.Operation:
    return proto.Operation(end, proto.OP_WRITE, rel, offset=offset, data=data)


def test_an_ack_file_waits_for_its_sync_unless_cut_due_or_closing(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    disk = SyncedContent(tmp_path, monkeypatch)
    monkeypatch.setattr(file_applier, "ACK_SYNC_INTERVAL", 3600.0)
    applier = FileApplier(tmp_path)
    apply_batch(applier, [write(1, "vh/msgs.0000000001", b"m" * 64), write(2, "vh/q/enq", b"e" * 8),
                          write(3, "vh/q/ack", b"a" * 8)])
    assert sorted(disk.fsyncs) == ["vh/msgs.0000000001", "vh/q/enq"]
    assert not applier.acks_due()
    apply_batch(applier, [write(4, "vh/q/ack", b"b" * 8, 8)])  # an ack alone: nothing to sync yet
    assert sorted(disk.fsyncs) == ["vh/msgs.0000000001", "vh/q/enq"]
    # the queue compacts: its enq is replaced and its ack file cut, both synced with the batch
    apply_batch(applier, [proto.Operation(5, proto.OP_REPLACE, "vh/q/enq", data=b"f" * 8),
                          proto.Operation(6, proto.OP_TRUNCATE, "vh/q/ack", size=0)])
    assert disk.synced["vh/q/ack"] == b"" and disk.synced["vh/q/enq"] == b"f" * 8
    apply_batch(applier, [write(7, "vh/q/ack", b"c" * 8)])
    assert disk.synced["vh/q/ack"] == b""
    monkeypatch.setattr(file_applier, "ACK_SYNC_INTERVAL", 0.0)  # due: the next commit takes it
    assert applier.acks_due()
    applier.commit()
    assert disk.synced["vh/q/ack"] == b"c" * 8 and not applier.acks_due()
    monkeypatch.setattr(file_applier, "ACK_SYNC_INTERVAL", 3600.0)
    apply_batch(applier, [write(8, "vh/q/ack", b"d" * 8, 8)])
    assert disk.synced["vh/q/ack"] == b"c" * 8
    applier.abort()  # the connection ended: everything is synced before the descriptors close
    assert disk.synced["vh/q/ack"] == b"c" * 8 + b"d" * 8


def test_a_failed_fsync_discards_the_unsynced_ack_files_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_applier, "ACK_SYNC_INTERVAL", 3600.0)
    monkeypatch.setattr(file_applier, "fsync_all", file_applier.pool_fsync_all)
    applier = FileApplier(tmp_path)
    apply_batch(applier, [write(1, "vh/q/enq", b"e" * 8), write(2, "vh/q/ack", b"a" * 8)])
    applier.apply(write(3, "vh/q/enq", b"e" * 8, 8))

    def fsync(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(ReplicaDiskError):
        applier.commit()
    # the ack file was never synced: a full sync must copy it again, as the enq written since
    assert sorted(p.name for p in (tmp_path / "vh" / "q").iterdir()) == []
