"""A follower's disk faults: short writes are completed, ENOSPC and EIO fail the batch (nothing is
acknowledged, the leader drops the follower), and after a failed fsync the files it cannot vouch for
are deleted or marked, so that the next full sync copies them again whatever their hash says.

Faults are injected by patching ``os`` functions for descriptors and paths under the follower's data
dir only (the leader runs in this process too), and, as root, by a real full tmpfs or ext4 image."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pika
import pytest

from lavinpy.cluster import file_applier, files
from lavinpy.cluster import replication_protocol as proto
from lavinpy.cluster.file_applier import FileApplier, ReplicaDiskError, apply_batch
from lavinpy.cluster.replication_client import ReplicationClient
from lavinpy.cluster.replication_server import ACK_TIMEOUT

from .replication_harness import REPO_ROOT, SECRET, Leader, replicated_hashes

pytestmark = pytest.mark.timeout(120)

REAL_PWRITE, REAL_WRITE, REAL_FSYNC, REAL_UNLINK = os.pwrite, os.write, os.fsync, os.unlink
PERSISTENT = pika.BasicProperties(delivery_mode=2)


def fd_path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def under(root: Path, path: str | os.PathLike) -> bool:
    return os.fspath(path).startswith(f"{root.resolve()}/")


def disk_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and "disk error" in r.getMessage()]


@pytest.fixture(autouse=True)
def _fresh_suspects(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(files, "_suspects_in_memory", {})
    # the faults are injected into os.fsync: a batch's files go through it (not the compiled fsync_all)
    monkeypatch.setattr(file_applier, "fsync_all", file_applier.pool_fsync_all)


@pytest.mark.parametrize("sync", ["compiled", "pool"])
def test_fsync_all_reports_each_descriptors_errno(sync: str, tmp_path: Path) -> None:
    if sync == "compiled" and file_applier.cstore is None:
        pytest.skip("the pure-Python path is selected")
    fds = [os.open(tmp_path / name, os.O_CREAT | os.O_RDWR) for name in "abc"]
    closed = os.open(tmp_path / "d", os.O_CREAT | os.O_RDWR)
    os.close(closed)
    try:
        run = file_applier.cstore.fsync_all if sync == "compiled" else file_applier.pool_fsync_all
        assert run([fds[0], closed, fds[1], fds[2]]) == [0, errno.EBADF, 0, 0]
    finally:
        for fd in fds:
            os.close(fd)


def _fsync_workers() -> set[str]:
    tasks = Path("/proc/self/task")
    found = set()
    for tid in os.listdir(tasks):
        try:  # other threads (the store's segment workers) may end meanwhile
            if (tasks / tid / "comm").read_text().strip() == "lavinpy-fsync":
                found.add(tid)
        except FileNotFoundError:
            continue
    return found


def test_compiled_fsync_all_keeps_its_worker_threads(tmp_path: Path) -> None:
    """Its workers are started once and kept, not one thread per descriptor and call; callers from
    several threads at once take turns and each gets its own descriptors' results."""
    if file_applier.cstore is None:
        pytest.skip("the pure-Python path is selected")
    fds = [os.open(tmp_path / name, os.O_CREAT | os.O_RDWR) for name in "abcd"]
    closed = os.open(tmp_path / "e", os.O_CREAT | os.O_RDWR)
    os.close(closed)
    try:
        assert file_applier.cstore.fsync_all(fds) == [0, 0, 0, 0]
        workers = _fsync_workers()
        assert len(workers) >= 3
        results: list[list[int]] = []

        def calls(own: list[int]) -> None:
            results.extend(file_applier.cstore.fsync_all(own) for _ in range(20))

        threads = [threading.Thread(target=calls, args=(own,)) for own in (fds, [closed, *fds[:2]])]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(results) == sorted([[0, 0, 0, 0]] * 20 + [[errno.EBADF, 0, 0]] * 20)
        assert _fsync_workers() == workers
    finally:
        for fd in fds:
            os.close(fd)


# ---- the applier alone ---------------------------------------------------------------------------

def test_short_writes_are_completed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cut = {"pwrite": True, "write": True}

    def pwrite(fd: int, data: bytes, offset: int) -> int:  # the first call writes all but one byte
        if cut["pwrite"] and len(data) > 1:
            cut["pwrite"] = False
            return REAL_PWRITE(fd, memoryview(data)[:-1], offset)
        return REAL_PWRITE(fd, data, offset)

    def write(fd: int, data: bytes) -> int:
        if cut["write"] and len(data) > 1:
            cut["write"] = False
            return REAL_WRITE(fd, memoryview(data)[:-1])
        return REAL_WRITE(fd, data)

    monkeypatch.setattr(os, "pwrite", pwrite)
    monkeypatch.setattr(os, "write", write)
    applier = FileApplier(tmp_path)
    index = os.urandom(4176)
    apply_batch(applier, [proto.Operation(1, proto.OP_WRITE, "vh/q/index", offset=7, data=index),
                          proto.Operation(2, proto.OP_REPLACE, "users.json", data=b'[{"name": "guest"}]\n')])
    assert (tmp_path / "vh/q/index").read_bytes() == bytes(7) + index
    assert (tmp_path / "users.json").read_bytes() == b'[{"name": "guest"}]\n'
    cut["pwrite"] = True
    chunk = os.urandom(100_000)
    applier.begin_file("vh/msgs.0000000001", len(chunk))
    applier.file_chunk(chunk)
    applier.end_file()
    applier.commit()
    assert (tmp_path / "vh/msgs.0000000001").read_bytes() == chunk


def test_enospc_after_a_short_write_fails_the_batch_and_names_the_file(tmp_path: Path, caplog,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def pwrite(fd: int, data: bytes, offset: int) -> int:  # ext4 at ENOSPC: 4,096 of 4,176, then the error
        calls.append(len(data))
        if len(calls) == 1:
            return REAL_PWRITE(fd, memoryview(data)[:4096], offset)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", pwrite)
    with pytest.raises(ReplicaDiskError) as raised:
        apply_batch(FileApplier(tmp_path), [proto.Operation(1, proto.OP_WRITE, "vh/q/index", data=bytes(4176))])
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == "vh/q/index"
    assert calls == [4176, 80]  # the rest was tried, not dropped
    [line] = disk_errors(caplog)
    assert "vh/q/index" in line and "ENOSPC" in line


@pytest.mark.parametrize("failing", ["commit", "end_file", "replace"])
def test_a_failed_fsync_deletes_what_was_written_since_the_last_commit(failing: str, tmp_path: Path, caplog,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    applier_seen: list[set[str]] = []
    applier = FileApplier(tmp_path, before_discard=lambda: applier_seen.append(
        {p.name for p in tmp_path.rglob("*") if p.is_file()}))
    apply_batch(applier, [proto.Operation(1, proto.OP_WRITE, "vh/committed", data=b"committed"),
                          proto.Operation(1, proto.OP_WRITE, "vh/appended", data=b"committed")])
    applier.apply(proto.Operation(2, proto.OP_WRITE, "vh/appended", offset=9, data=b" and more"))
    applier.apply(proto.Operation(3, proto.OP_WRITE, "vh/new", data=b"new"))
    applier.begin_file("vh/received", 3)
    applier.file_chunk(b"abc")
    applier.end_file()
    synced: list[str] = []
    lock = threading.Lock()  # the commit fsyncs its files in parallel

    def fsync(fd: int) -> None:  # EIO for the first one, and a record of every later fsync
        with lock:
            synced.append(fd_path(fd))
            if len(synced) == 1:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
        REAL_FSYNC(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(ReplicaDiskError) as raised:
        if failing == "commit":
            applier.commit()
        elif failing == "end_file":
            applier.begin_file("vh/second", 3)
            applier.file_chunk(b"def")
            applier.end_file()
        else:
            applier.apply(proto.Operation(4, proto.OP_REPLACE, "vh/replaced", data=b"[]"))
    assert raised.value.errno == errno.EIO
    assert applier_seen and "received" in applier_seen[0]  # the hook ran before anything was deleted
    # Everything changed since the last commit is gone (a committed file too if it was written
    # again), with the temporaries; the file whose fsync failed was not fsynced again.
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["committed"]
    assert not [p for p in synced[1:] if p.removesuffix(" (deleted)") == synced[0]]
    [line] = disk_errors(caplog)
    assert "EIO" in line and "deleted" in line
    with pytest.raises(ReplicaDiskError):  # and the applier takes nothing more
        applier.apply(proto.Operation(5, proto.OP_WRITE, "vh/other", data=b"x"))
    with pytest.raises(ReplicaDiskError):
        applier.commit()
    synced_before_abort = len(synced)
    applier.abort()
    assert len(synced) == synced_before_abort


def test_files_that_cannot_be_deleted_nor_marked_stay_suspect_in_this_process(
        tmp_path: Path, caplog, monkeypatch: pytest.MonkeyPatch) -> None:
    applier = FileApplier(tmp_path)
    applier.apply(proto.Operation(1, proto.OP_WRITE, "vh/index", data=b"page cache only"))
    failed = {"fsync": False}

    def fsync(fd: int) -> None:
        if not failed["fsync"]:
            failed["fsync"] = True
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        REAL_FSYNC(fd)

    def refuse(path: os.PathLike | str, *args: object, **kwargs: object) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(path))

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "unlink", refuse)
    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(ReplicaDiskError):
        applier.commit()
    assert not (tmp_path / files.SUSPECT_FILE).exists()
    assert any(r.levelno == logging.CRITICAL and "vh/index" in r.getMessage() for r in caplog.records)
    listing = proto.list_files(tmp_path)
    assert listing["vh/index"] == (15, proto.UNPROVEN_SHA1)


# ---- a real leader and this process's replication client -----------------------------------------

class Follower:
    """A ReplicationClient of this process, on an event loop of its own, so that the os functions a
    test patches reach its writes."""

    def __init__(self, data_dir: Path, port: int) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.client = ReplicationClient(data_dir, SECRET, "follower", "127.0.0.1", port)
        self.run = asyncio.run_coroutine_threadsafe(self.client.run(), self.loop)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.client.close(), self.loop).result(10)
        try:
            self.run.result(10)
        except Exception:  # noqa: BLE001 - the test looked at it already, or did not care
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@pytest.fixture
def leader(tmp_path: Path):
    node = Leader(tmp_path / "leader").start()
    yield node
    node.stop()


def publish_when_caught_up(leader: Leader, arm: Callable[[], None]) -> tuple[float, float]:
    """Declare a queue, wait until the follower has everything, ``arm()`` the fault, publish one
    persistent message and wait for its confirm: (time published, time confirmed)."""
    connection = pika.BlockingConnection(pika.URLParameters(leader.url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("q", durable=True)  # its declare-ok waits for the follower
        leader.wait_caught_up("follower")
        arm()
        started = time.monotonic()
        channel.basic_publish("", "q", b"m" * 4000, PERSISTENT)
        return started, time.monotonic()
    finally:
        connection.close()


def record_applied(monkeypatch: pytest.MonkeyPatch) -> list[proto.Operation]:
    applied: list[proto.Operation] = []
    original = FileApplier.apply

    def apply(self: FileApplier, operation: proto.Operation) -> None:
        applied.append(operation)
        original(self, operation)
    monkeypatch.setattr(FileApplier, "apply", apply)
    return applied


def record_resent(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    resent: list[str] = []
    original = FileApplier.begin_file

    def begin_file(self: FileApplier, rel: str, size: int = 0) -> None:
        resent.append(rel)
        original(self, rel, size)
    monkeypatch.setattr(FileApplier, "begin_file", begin_file)
    return resent


def test_a_follower_at_enospc_acknowledges_nothing_and_is_dropped_at_once(leader: Leader, tmp_path: Path, caplog,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    follower_dir = tmp_path / "follower"
    full = threading.Event()

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        # A full disk: a segment's blocks were reserved when it was created, but the queue index
        # needs new ones. Its write is cut short (as ext4 did: 4,096 of 4,176 bytes), the rest fails.
        path = fd_path(fd)
        if not under(follower_dir, path) or Path(path).name.startswith("msgs."):
            return REAL_PWRITE(fd, data, offset)
        if full.is_set() or len(data) < 2:
            full.set()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        full.set()
        return REAL_PWRITE(fd, memoryview(data)[:len(data) - 1], offset)

    applied = record_applied(monkeypatch)
    follower = Follower(follower_dir, leader.replication.port)
    try:
        leader.wait_caught_up("follower")
        started, confirmed = publish_when_caught_up(
            leader, lambda: (applied.clear(), monkeypatch.setattr(os, "pwrite", pwrite)))
        assert full.is_set() and applied
        # the batch that met the full disk was never acknowledged...
        assert follower.client.acked < applied[-1].end
        # ...so the confirm waited until the follower was out of the ISR, which closing the
        # connection brought about at once (not the ack timeout)
        drop_time, members = leader.isr.writes[-1]
        assert members == ["leader"] and drop_time <= confirmed
        assert confirmed - started < ACK_TIMEOUT
        with pytest.raises(ReplicaDiskError) as raised:
            follower.run.result(10)
        assert raised.value.errno == errno.ENOSPC and raised.value.filename.endswith("/enq")
        assert any("follower" in r.getMessage() and "dropped: connection closed" in r.getMessage()
                   for r in caplog.records)
        [line] = disk_errors(caplog)
        assert "ENOSPC" in line and raised.value.filename in line
    finally:
        follower.stop()


@pytest.mark.parametrize("deletable", [True, False], ids=["deleted", "marked"])
def test_after_a_failed_fsync_the_next_full_sync_copies_the_files_again(
        deletable: bool, leader: Leader, tmp_path: Path, caplog, monkeypatch: pytest.MonkeyPatch) -> None:
    follower_dir = tmp_path / "follower"
    lock = threading.Lock()
    failed: list[str] = []  # the file whose fsync failed
    synced_again: list[str] = []

    def fsync(fd: int) -> None:  # one EIO on a follower's file; a second fsync of it would lie
        path = fd_path(fd)
        # A written file, not the scratch copy of a replaced one (a queue's first publish now makes its
        # name file that way: a failed fsync there only drops the scratch copy, tested elsewhere).
        if under(follower_dir, path) and stat.S_ISREG(os.fstat(fd).st_mode) and not path.endswith(".tmp"):
            with lock:
                if not failed:
                    failed.append(path)
                    raise OSError(errno.EIO, os.strerror(errno.EIO))
                if path.removesuffix(" (deleted)") == failed[0]:
                    synced_again.append(path)
        REAL_FSYNC(fd)

    def unlink(path: os.PathLike | str, *args: object, **kwargs: object) -> None:
        if under(follower_dir, path):
            raise OSError(errno.EIO, os.strerror(errno.EIO), os.fspath(path))
        REAL_UNLINK(path, *args, **kwargs)

    def arm() -> None:
        applied.clear()
        monkeypatch.setattr(os, "fsync", fsync)
        if not deletable:
            monkeypatch.setattr(os, "unlink", unlink)

    applied = record_applied(monkeypatch)
    follower = Follower(follower_dir, leader.replication.port)
    try:
        leader.wait_caught_up("follower")
        publish_when_caught_up(leader, arm)
        with pytest.raises(ReplicaDiskError) as raised:
            follower.run.result(10)
        assert raised.value.errno == errno.EIO
        assert failed and not synced_again, "the file whose fsync failed was fsynced again"
        written = {op.path for op in applied if op.kind in (proto.OP_WRITE, proto.OP_TRUNCATE)}
        assert os.path.relpath(failed[0], follower_dir.resolve()) in written
        if deletable:
            assert not any((follower_dir / rel).exists() for rel in written)
            assert not (follower_dir / files.SUSPECT_FILE).exists()
        else:
            # still there, and what the page cache shows equals the leader's: only the mark tells
            assert written <= set((follower_dir / files.SUSPECT_FILE).read_text().split())
            for rel in written:
                assert _sha1(follower_dir / rel) == _sha1(leader.data_dir / rel)
            assert all(proto.list_files(follower_dir)[rel][1] == proto.UNPROVEN_SHA1 for rel in written)
        assert len(disk_errors(caplog)) == 1
    finally:
        follower.stop()
    monkeypatch.undo()
    # as after a restart of the process: only the data dir remembers
    monkeypatch.setattr(files, "_suspects_in_memory", {})
    resent = record_resent(monkeypatch)
    follower = Follower(follower_dir, leader.replication.port)
    try:
        leader.wait_caught_up("follower")
        assert leader.isr.members == ["leader", "follower"]
    finally:
        follower.stop()
    assert written <= set(resent)
    assert not (follower_dir / files.SUSPECT_FILE).exists()
    assert replicated_hashes(follower_dir) == replicated_hashes(leader.data_dir)


def _sha1(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()


# ---- a real full filesystem (root) ---------------------------------------------------------------

_FILL_AND_APPLY = r"""
import json, os, sys
from pathlib import Path
from lavinpy.cluster import replication_protocol as proto
from lavinpy.cluster import file_applier
from lavinpy.cluster.file_applier import FileApplier, ReplicaDiskError, apply_batch

mount = Path(sys.argv[1])
data = mount / "data"
data.mkdir()
applier = FileApplier(data)
# the file and its directories exist before the disk fills: only the write itself lacks space
apply_batch(applier, [proto.Operation(0, proto.OP_TRUNCATE, "vh/q/index", size=0)])
fd = os.open(mount / "ballast", os.O_WRONLY | os.O_CREAT)
size = 0
try:
    while True:
        size += os.write(fd, b"b" * 65536)
except OSError:
    pass
os.ftruncate(fd, size - 6000)  # about one block free again
os.fsync(fd)
os.close(fd)
returned = []
real = os.pwrite
def pwrite(fd, view, offset):  # observes only: what the kernel wrote
    n = real(fd, view, offset)
    returned.append((len(view), n))
    return n
os.pwrite = pwrite
body = os.urandom(100_000)
result = {"returned": returned}
try:
    apply_batch(applier, [proto.Operation(1, proto.OP_WRITE, "vh/q/index", offset=10, data=body)])
    result["acknowledgeable"] = True
    result["exact"] = (data / "vh/q/index").read_bytes() == bytes(10) + body
except ReplicaDiskError as exc:
    result["error"] = [exc.errno, exc.filename]
print(json.dumps(result))
"""


def _mount_commands(kind: str, mount: Path, image: Path) -> str:
    if kind == "tmpfs":
        return f"mount -t tmpfs -o size=4m tmpfs {mount}"
    subprocess.run(["truncate", "-s", "16M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    return f"mount -o loop {image} {mount}"


@pytest.mark.parametrize("kind", ["tmpfs", "ext4"])
def test_a_short_write_on_a_really_full_filesystem_is_not_acknowledgeable(kind: str, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: mounts a small filesystem in a private mount namespace")
    if shutil.which("unshare") is None or (kind == "ext4" and shutil.which("mkfs.ext4") is None):
        pytest.skip(f"needs unshare{' and mkfs.ext4' if kind == 'ext4' else ''}")
    mount = tmp_path / "mnt"
    mount.mkdir()
    mount_command = _mount_commands(kind, mount, tmp_path / "disk.img")
    script = f'{mount_command} && exec "$0" -c "$1" {mount}'
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, sys.executable,
                           _FILL_AND_APPLY], cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                          capture_output=True, text=True, timeout=60)
    if done.returncode != 0 and "mount" in done.stderr and "Traceback" not in done.stderr:
        pytest.skip(f"cannot mount a {kind} here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert any(n < asked for asked, n in result["returned"]), f"the kernel wrote no short write: {result}"
    # Either the write was completed and the file is exact, or the batch fails with ENOSPC: a short
    # write never passes for a complete one.
    if "error" in result:
        assert result["error"] == [errno.ENOSPC, "vh/q/index"]
    else:
        assert result["exact"], result
    if kind == "tmpfs":  # tmpfs has no slack: the rest cannot be written
        assert "error" in result, result
