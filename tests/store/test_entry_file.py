"""EntryFile: recovery after a crash mid-append, appends, sync bookkeeping, rewrite, removal, and the
change feed that replication follows; then the fsync policy as the vhost store applies it."""

from __future__ import annotations

import asyncio
import logging
import os
from array import array
from pathlib import Path

import pytest

from lavinpy.store import changes, fsyncs
from lavinpy.store.datadir import sha1_name
from lavinpy.store.entry_file import EntryFile
from lavinpy.store.vhost_store import VhostStore


class Feed:
    """A change listener that records every operation."""

    def __init__(self) -> None:
        self.ops: list[tuple] = []

    def file_appended(self, rel_path: str, offset: int, data: bytes) -> None:
        self.ops.append(("append", rel_path, offset, data))

    def file_replaced(self, rel_path: str, data: bytes) -> None:
        self.ops.append(("replace", rel_path, data))

    def file_truncated(self, rel_path: str, size: int) -> None:
        self.ops.append(("truncate", rel_path, size))

    def file_deleted(self, rel_path: str) -> None:
        self.ops.append(("delete", rel_path))

    def dir_deleted(self, rel_path: str) -> None:
        self.ops.append(("rmdir", rel_path))


@pytest.fixture
def feed(tmp_path: Path):
    listener = Feed()
    changes.attach(tmp_path, listener)
    yield listener
    changes.attach(tmp_path, None)


def entries(*values: int) -> array:
    return array("Q", values)


def open_file(path: Path, closed: list[int] | None = None) -> tuple[EntryFile, array]:
    file = EntryFile(path, 8, "queue 'q'", close_fd=closed.append if closed is not None else os.close)
    return file, file.recover()


def test_append_and_reopen(tmp_path: Path, feed: Feed) -> None:
    file, found = open_file(tmp_path / "enq")
    assert len(found) == 0 and file.is_open and file.size == 0
    assert feed.ops == [("truncate", "enq", 0)]  # created: the follower creates it too
    assert file.append(entries(1, 2)) == 16
    assert file.append(entries(3)) == 8
    assert file.size == 24
    assert feed.ops[1:] == [("append", "enq", 0, entries(1, 2).tobytes()),
                            ("append", "enq", 16, entries(3).tobytes())]
    file.close()
    assert not file.is_open
    file.close()  # twice is harmless
    again, found = open_file(tmp_path / "enq")
    assert list(found) == [1, 2, 3] and again.size == 24
    again.close()


def test_torn_tail_after_a_crash_mid_append(tmp_path: Path, feed: Feed, caplog) -> None:
    file, _ = open_file(tmp_path / "enq")
    file.append(entries(10, 11, 12))
    os.write(file.fd, entries(13).tobytes()[:5])  # the process died inside the next write
    file.close()
    feed.ops.clear()
    with caplog.at_level(logging.WARNING, logger="lavinpy.store"):
        file, found = open_file(tmp_path / "enq")
    assert list(found) == [10, 11, 12]
    assert (tmp_path / "enq").stat().st_size == 24  # the partial entry is cut off the file
    assert feed.ops == [("truncate", "enq", 24)]
    assert any("partial entry of 5 bytes" in r.getMessage() and "queue 'q'" in r.getMessage()
               for r in caplog.records)
    file.append(entries(13))  # later entries are whole entries again
    file.close()
    assert list(open_file(tmp_path / "enq")[1]) == [10, 11, 12, 13]


def test_entries_of_another_size_and_typecode(tmp_path: Path) -> None:
    file = EntryFile(tmp_path / "counts", 16, "queue 'q'")
    assert len(file.recover("B", create=False)) == 0 and not file.is_open  # optional file: absent
    assert not (tmp_path / "counts").exists()
    file.create()
    file.append(b"a" * 16 + b"b" * 16)
    file.close()
    with open(tmp_path / "counts", "ab") as f:
        f.write(b"c" * 15)
    file = EntryFile(tmp_path / "counts", 16, "queue 'q'")
    data = file.recover("B", create=False)
    assert data.tobytes() == b"a" * 16 + b"b" * 16 and file.size == 32
    file.close()


def test_optional_file_reports_only_a_cut(tmp_path: Path, feed: Feed) -> None:
    (tmp_path / "counts").write_bytes(b"x" * 32)
    file = EntryFile(tmp_path / "counts", 16, "queue 'q'")
    file.recover("B", create=False)
    assert feed.ops == []  # whole already: nothing changed, nothing reported
    file.close()


def test_sync_bookkeeping(tmp_path: Path) -> None:
    file, _ = open_file(tmp_path / "enq")
    fds: list[int] = []
    file.take_unsynced(fds)
    assert fds == [] and not file.unsynced  # nothing written yet
    file.append(entries(1))
    assert file.unsynced
    file.take_unsynced(fds)
    assert fds == [file.fd] and not file.unsynced
    fds.clear()
    file.take_unsynced(fds)
    assert fds == []
    file.mark_unsynced()  # the flush failed: the next one syncs it again
    file.take_unsynced(fds)
    assert fds == [file.fd]
    file.append(entries(2))
    file.rewrite(entries(2))  # the rewritten file is on disk already
    assert not file.unsynced
    file.close()
    file.mark_unsynced()  # closed: nothing to sync
    assert not file.unsynced


def test_rewrite_keeps_the_live_entries(tmp_path: Path, feed: Feed) -> None:
    closed: list[int] = []
    file, _ = open_file(tmp_path / "enq", closed)
    file.append(entries(*range(1, 101)))
    old_fd = file.fd
    live = entries(*range(51, 101, 7))
    file.rewrite(live)
    assert closed == [old_fd]  # the old descriptor goes through the store (a flush may be syncing it)
    assert file.size == len(live) * 8 and file.fd != old_fd
    assert not (tmp_path / "enq.tmp").exists()
    assert feed.ops[-1] == ("replace", "enq", live.tobytes())
    file.append(entries(500))  # appends continue on the new file
    assert feed.ops[-1] == ("append", "enq", len(live) * 8, entries(500).tobytes())
    file.close()
    assert list(open_file(tmp_path / "enq")[1]) == [*live, 500]


def test_interrupted_rewrite_leaves_the_old_file(tmp_path: Path) -> None:
    file, _ = open_file(tmp_path / "enq")
    file.append(entries(1, 2, 3))
    file.close()
    (tmp_path / "enq.tmp").write_bytes(entries(3).tobytes())  # crashed before the rename
    file, found = open_file(tmp_path / "enq")
    assert list(found) == [1, 2, 3]
    assert not (tmp_path / "enq.tmp").exists()
    file.close()


def test_truncate_and_remove(tmp_path: Path, feed: Feed) -> None:
    file, _ = open_file(tmp_path / "ack")
    file.append(entries(1, 2))
    file.truncate(0)
    assert file.size == 0 and (tmp_path / "ack").stat().st_size == 0
    assert feed.ops[-1] == ("truncate", "ack", 0)
    file.append(entries(3))
    assert feed.ops[-1] == ("append", "ack", 0, entries(3).tobytes())  # O_APPEND: at the new end
    file.remove()
    assert not file.is_open and not (tmp_path / "ack").exists() and file.size == 0
    assert feed.ops[-1] == ("delete", "ack")
    file.remove()  # already gone: nothing more to report
    assert feed.ops[-1] == ("delete", "ack") and len([op for op in feed.ops if op[0] == "delete"]) == 1
    file.create()  # and back on the next append
    assert file.is_open and (tmp_path / "ack").exists()
    file.close()


def _fsynced_during_flush(tmp_path: Path, policy: str, monkeypatch) -> list[str]:
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    async def scenario() -> None:
        store = VhostStore(tmp_path / policy, fsync=policy, fsync_interval_ms=1)
        store.open()
        q = store.open_queue("q", True)
        store.finish_recovery()
        pos = store.messages.append("", "q", b"\x00\x00", b"body")
        q.push(pos)
        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(fsyncs, "fsync_all", fsyncs.pool_fsync_all)  # the flush's files: through os.fsync
        monkeypatch.setattr(fsyncs, "ON_LOOP", False)  # not started from the loop in C workers
        await store.flush()
        monkeypatch.setattr(os, "fsync", real_fsync)
        assert (q.directory / "enq").stat().st_size == 8  # handed to the OS under every policy
        store.close()

    asyncio.run(scenario())
    return synced


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to name descriptors")
@pytest.mark.parametrize("policy", ["always", "batch", "never"])
def test_fsync_policy(tmp_path: Path, policy: str, monkeypatch) -> None:
    synced = _fsynced_during_flush(tmp_path, policy, monkeypatch)
    if policy == "never":
        assert synced == []  # a flush only hands the entries to the OS
    else:
        # the segment and the index entry at once, then the names the queue's first write made: its
        # .queue file, its directory's entries, the directory in the vhost's
        assert sorted(synced[:2]) == ["enq", "msgs.0000000001"]
        assert synced[2:] == [".queue", sha1_name("q"), policy]
