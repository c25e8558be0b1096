"""A follower's writes: the leader's operations applied under the data directory, made durable on
``commit()`` (blocking; called from the replication client's own thread).

Disk faults: every write loops until it is complete, and any OSError while applying or committing
raises ``ReplicaDiskError``, so that the batch is not acknowledged (the client then closes the
connection and the leader drops this follower from the ISR). After a failed fsync the page cache may
hold data the disk never got, and Linux reports such an error only once: a retried fsync, or a hash
read by the next full sync, would lie. So the applier then deletes every file written since the last
successful commit, and lists those it cannot delete in a marker (``files.SUSPECT_FILE``) that makes
the next full sync copy them whatever their hash says. The applier is unusable after that.

A queue's ack file that a batch only appended to is not synced with the batch (at most
``ACK_SYNC_INTERVAL`` later, and whenever it is cut, closed or the connection ends): what a confirm
needs on every node that could be elected is the message and its enq entry. An ack lost in a crash of
this node means a redelivery after it is elected, as it does on the leader, whose confirm flush does
not sync ack files either; the file then holds a subset of the acks, never one too many, so no unacked
message can be hidden by it.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from ..store.accel import cstore  # noqa: F401  (tests reach the compiled fsync_all here)
from ..store.fsyncs import fsync_all, pool_fsync_all  # noqa: F401  (pool_fsync_all: tests swap it in)
from ..store.jsonfile import fsync_dir, pwrite_all
from ..store.message_store import SEGMENT_FILE
from ..store.queue_index import ACK_FILE
from ..store.segment_files import REMOVED_SUFFIX, removed_path, unlink_later
from . import files
from . import replication_protocol as proto

log = logging.getLogger("lavinpy.cluster.replication")

MAX_OPEN = 64  # descriptors kept open between batches
_FILE_FLAGS = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
_TMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
ACK_SYNC_INTERVAL = 1.0  # seconds an appended ack file may wait for its fsync
_ACTIONS = {proto.OP_WRITE: "write", proto.OP_TRUNCATE: "truncate", proto.OP_REPLACE: "replace",
            proto.OP_DELETE: "delete", proto.OP_RMDIR: "rmdir"}


class ReplicaDiskError(OSError):
    """Writing or syncing a replicated file failed: the batch is not durable and must not be
    acknowledged. ``errno`` is the system's, ``filename`` the path relative to the data directory."""

    def __init__(self, err: int, rel: str, action: str, detail: str = "") -> None:
        super().__init__(err, os.strerror(err), rel)
        self.action = action
        self.detail = detail  # what was discarded because of it

    def __str__(self) -> str:
        code = self.errno or 0  # always set: the constructor passes it
        name = errno.errorcode.get(code, str(code))
        text = f"{self.action} of {self.filename} failed: {name} ({self.strerror})"
        return f"{text}; {self.detail}" if self.detail else text


class FileApplier:
    """Applies operations under a data directory and makes them durable on ``commit()`` (blocking).

    ``before_discard`` is called before files are deleted after a failed fsync: from then on the copy
    misses data it may already have acknowledged, which a durable mark should say first.
    """

    def __init__(self, root: Path, before_discard: Callable[[], None] | None = None) -> None:
        self.root = Path(root)
        self._before_discard = before_discard
        self._fds: dict[str, int] = {}  # open across commits: the same few files take every batch
        self._written: dict[str, int] = {}  # files written through _fds since the last commit
        self._lagging: dict[str, int] = {}  # ack files only appended to since their last sync
        self._lagging_since = 0.0  # monotonic time the oldest of them became unsynced
        self._cut: set[str] = set()  # files truncated since the last commit: synced with it, whatever they are
        self._renamed: set[str] = set()  # files replaced or received since the last commit
        self._dirs: set[Path] = set()  # directories whose entries changed
        self._receiving: tuple[str, int, int] | None = None  # full sync: (path, fd of its .tmp, offset)
        self._broken: ReplicaDiskError | None = None  # set once files were discarded
        # Suspect files are cleared from the marker once replaced or deleted and committed.
        # (one that no longer exists is not listed by the next full sync, so nothing to vouch for)
        try:
            listed = files.suspect_files(self.root)
            self._suspects = {rel for rel in listed if _valid(rel) and (self.root / rel).exists()}
        except OSError:  # the full sync's file list reads the marker again, and fails there
            listed, self._suspects = set(), set()
        self._suspects_changed = self._suspects != listed
        for leftover in self.root.glob("*/.msgs.*" + REMOVED_SUFFIX):  # removals a stop cut short
            leftover.unlink(missing_ok=True)

    def _path(self, rel: str) -> Path:
        return self.root / proto.check_path(rel)

    def _fd(self, rel: str) -> int:
        fd = self._fds.get(rel)
        if fd is None:
            path = self._path(rel)
            self._make_parent(path)
            if not path.exists():
                self._dirs.add(path.parent)
            fd = self._fds[rel] = os.open(path, _FILE_FLAGS, 0o600)
        self._written[rel] = fd
        return fd

    def _make_parent(self, path: Path) -> None:
        parent = path.parent
        if not parent.is_dir():
            parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            for directory in (parent, *parent.parents):  # new names up to the root must be durable
                self._dirs.add(directory)
                if directory == self.root:
                    break

    def _forget(self, prefix: str) -> None:
        for rel in [r for r in self._fds if r == prefix or r.startswith(prefix + "/")]:
            fd = self._fds.pop(rel)
            self._written.pop(rel, None)  # the file is about to be deleted or replaced
            self._lagging.pop(rel, None)
            os.close(fd)

    def _resolved(self, prefix: str) -> None:
        """Files under ``prefix`` were replaced by a complete copy or deleted: no longer suspect."""
        if self._suspects:
            gone = {r for r in self._suspects if r == prefix or r.startswith(prefix + "/")}
            if gone:
                self._suspects -= gone
                self._suspects_changed = True

    # ---- operations -------------------------------------------------------------------------------

    def apply(self, operation: proto.Operation) -> None:
        """Apply one stream operation; raises ReplicaDiskError when the disk refuses it."""
        if self._broken is not None:
            raise self._broken
        try:
            self._apply(operation)
        except ReplicaDiskError:
            raise
        except OSError as exc:
            raise self._fail(_ACTIONS.get(operation.kind, "apply"), operation.path, exc) from exc

    def _apply(self, operation: proto.Operation) -> None:
        kind, rel = operation.kind, operation.path
        if kind == proto.OP_WRITE:
            pwrite_all(self._fd(rel), (operation.data,), operation.offset)
        elif kind == proto.OP_TRUNCATE:
            fd = self._fd(rel)
            self._cut.add(rel)
            grown = operation.size - os.fstat(fd).st_size
            os.ftruncate(fd, operation.size)
            if grown > 0:
                _reserve(fd, operation.size - grown, grown)
        elif kind == proto.OP_REPLACE:
            self._forget(rel)
            self._replace(rel, operation.data)
        elif kind == proto.OP_DELETE:
            self._delete(rel, streamed=True)
        elif kind == proto.OP_RMDIR:
            self._forget(rel)
            path = self._path(rel)
            try:  # any other error must fail the batch: a directory left behind would come back
                shutil.rmtree(path)
            except FileNotFoundError:
                pass
            self._resolved(rel)
            self._dirs.add(path.parent)

    def replace(self, rel: str, data: bytes) -> None:
        """The file's whole content becomes ``data`` (written and fsynced before the rename)."""
        self._guard("replace", rel, self._replace, rel, data)

    def _replace(self, rel: str, data: bytes | memoryview) -> None:
        path = self._path(rel)
        self._make_parent(path)
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, _TMP_FLAGS, 0o600)
        try:
            _write_all(fd, data, tmp)
        except OSError:
            os.close(fd)
            _unlink_quietly(tmp)
            raise
        self._install_received(rel, fd, tmp, path)

    def delete(self, rel: str) -> None:
        self._guard("delete", rel, self._delete, rel)

    def _delete(self, rel: str, streamed: bool = False) -> None:
        self._forget(rel)
        path = self._path(rel)
        if streamed and SEGMENT_FILE.fullmatch(path.name):
            self._delete_segment(rel, path)
            return
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        else:
            self._dirs.add(path.parent)
            parent = path.parent  # directories the leader no longer has are emptied and removed
            while parent != self.root and not any(parent.iterdir()):
                parent.rmdir()
                self._dirs.add(parent.parent)
                parent = parent.parent
        self._resolved(rel)

    def _delete_segment(self, rel: str, path: Path) -> None:
        """A streamed segment removal: its name goes at once, its blocks in the store's removal thread
        (unlinking a written segment of 8 MiB takes milliseconds, in which no batch was acknowledged and
        no confirm went out; 3-5 ms a segment measured, a segment every 0.1 s in scenario b).
        Not synced with the batch (nor is the leader's own removal): a segment that comes back after a
        crash is referenced by no index entry the leader still holds, and is deleted by the next full
        sync or, if this node leads, by the store's open (as is a leftover under its removed name)."""
        removed = removed_path(path)
        try:
            os.rename(path, removed)
        except FileNotFoundError:
            pass
        else:
            unlink_later(removed)
        self._resolved(rel)

    # full sync: a file arrives in chunks into <name>.tmp and is renamed over its name at the end
    def begin_file(self, rel: str, size: int = 0) -> None:
        self._guard("create", rel, self._begin_file, rel, size)

    def _begin_file(self, rel: str, size: int) -> None:
        self._forget(rel)
        path = self._path(rel)
        self._make_parent(path)
        fd = os.open(path.with_name(path.name + ".tmp"), _TMP_FLAGS, 0o600)
        self._receiving = (rel, fd, 0)
        if size:
            _reserve(fd, 0, size)

    def file_chunk(self, data: bytes) -> None:
        if self._receiving is None:
            raise proto.ProtocolError("file data outside a file")
        rel, fd, offset = self._receiving
        self._guard("write", rel, pwrite_all, fd, (data,), offset)
        self._receiving = (rel, fd, offset + len(data))

    def end_file(self) -> None:
        if self._receiving is None:
            raise proto.ProtocolError("file end outside a file")
        (rel, fd, received), self._receiving = self._receiving, None
        self._guard("write", rel, self._end_file, rel, fd, received)

    def _end_file(self, rel: str, fd: int, received: int) -> None:
        path = self._path(rel)
        tmp = path.with_name(path.name + ".tmp")
        try:
            os.ftruncate(fd, received)  # the reservation was for the size announced
        except OSError:
            os.close(fd)
            _unlink_quietly(tmp)
            raise
        self._install_received(rel, fd, tmp, path)

    def _install_received(self, rel: str, fd: int, tmp: Path, path: Path) -> None:
        """fsync and close a file written in full into ``tmp`` (a replace or a full-sync file), then
        rename it over ``path``."""
        try:
            os.fsync(fd)
        except OSError as exc:
            _close_quietly(fd)  # never synced again: a second fsync would report success
            _unlink_quietly(tmp)  # local scratch: never listed, so nothing to vouch for
            raise self._fail("fsync", rel, exc, discard=True) from exc
        os.close(fd)
        os.replace(tmp, path)
        self._renamed.add(rel)
        self._resolved(rel)
        self._dirs.add(path.parent)

    def _guard(self, action: str, rel: str, work: Callable[..., None], *args: object) -> None:
        """Run ``work``: on a broken applier not at all, and any OSError as a ReplicaDiskError."""
        if self._broken is not None:
            raise self._broken
        try:
            work(*args)
        except ReplicaDiskError:
            raise
        except OSError as exc:
            raise self._fail(action, rel, exc) from exc

    # ---- durability -------------------------------------------------------------------------------

    def commit(self, everything: bool = False) -> None:
        """fsync every file and directory changed since the last commit, but an ack file only appended
        to (see the module's doc; ``everything``: those too). On a failure the files changed since
        their last sync are discarded and ReplicaDiskError is raised."""
        if self._broken is not None:
            raise self._broken
        written = self._take_synced(everything or len(self._fds) > MAX_OPEN)
        # The changed directories with the files, at once: one journal commit can then cover them all
        # (a directory synced after the files was one more commit in every batch that created a
        # segment or an index file).
        directories = self._open_dirs()
        synced = {**written, **directories}
        try:
            if len(synced) > 1:
                for (rel, _fd), err in zip(synced.items(), fsync_all(list(synced.values())), strict=True):
                    if err:  # of a directory: new names in it may be lost, its new files count as unwritten
                        failed = OSError(err, os.strerror(err))
                        raise self._fail("fsync", rel, failed, discard=True) from failed
            elif synced:
                [(rel, fd)] = synced.items()
                try:
                    os.fsync(fd)
                except OSError as exc:
                    raise self._fail("fsync", rel, exc, discard=True) from exc
        finally:
            for fd in directories.values():
                os.close(fd)
        self._written = {}
        self._cut.clear()
        self._dirs.clear()
        self._renamed.clear()
        if len(self._fds) > MAX_OPEN:
            self.close_files()
        if self._suspects_changed:
            self._record_suspects()

    def _open_dirs(self) -> dict[str, int]:
        """Descriptors of the directories whose entries changed, keyed by their relative path + "/"
        (one removed meanwhile is skipped: its entry in its parent is what counts)."""
        opened: dict[str, int] = {}
        try:
            for directory in self._dirs:
                try:
                    fd = os.open(directory, _DIR_FLAGS)
                except FileNotFoundError:
                    continue
                rel = directory.relative_to(self.root).as_posix() if directory != self.root else "."
                opened[rel + "/"] = fd
        except OSError as exc:
            for fd in opened.values():
                os.close(fd)
            raise self._fail("fsync", "./", exc, discard=True) from exc
        return opened

    def _take_synced(self, everything: bool) -> dict[str, int]:
        """The files this commit syncs (``_written`` becomes them): the lagging ack files stay out
        unless ``everything`` or the oldest has waited ``ACK_SYNC_INTERVAL``."""
        written = self._written
        lagging = self._lagging
        for rel in [r for r in written if r.rpartition("/")[2] == ACK_FILE and r not in self._cut]:
            if not lagging:
                self._lagging_since = time.monotonic()
            lagging[rel] = written.pop(rel)
        if lagging and (everything or self.acks_due()):
            written.update(lagging)
            lagging.clear()
        return written

    def acks_due(self) -> bool:
        """Whether an ack file has waited ``ACK_SYNC_INTERVAL`` for its fsync (an idle stream commits
        then, with no batch)."""
        return bool(self._lagging) and time.monotonic() - self._lagging_since >= ACK_SYNC_INTERVAL

    def _record_suspects(self) -> None:
        try:
            files.write_suspects(self.root, self._suspects)
            self._suspects_changed = False
        except OSError as exc:  # not a loss: the next full sync copies them once more
            log.warning("replication: could not update %s: %s", files.SUSPECT_FILE, exc)

    def close_files(self) -> None:
        """Close the open descriptors (after a commit: nothing written is left unsynced)."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def abort(self) -> None:
        """The connection ended: make what was applied durable (or discard it) and close everything."""
        if self._receiving is not None:
            os.close(self._receiving[1])
            self._receiving = None
        if self._broken is None:
            try:
                self.commit(everything=True)
            except ReplicaDiskError:
                pass  # logged, and what could not be made durable is discarded
        self.close_files()

    # ---- failures ---------------------------------------------------------------------------------

    def _fail(self, action: str, rel: str, exc: OSError, *, discard: bool = False) -> ReplicaDiskError:
        """The ReplicaDiskError for ``exc``, logged once; after a failed fsync, discard first."""
        detail = self._discard() if discard else ""
        error = ReplicaDiskError(exc.errno or errno.EIO, rel, action, detail)
        if discard:
            self._broken = error
        log.error("replication: disk error, not acknowledged: %s", error)
        return error

    def _discard(self) -> str:
        """Delete every file changed since the last commit; list in the marker those that stay."""
        if self._before_discard is not None:
            try:
                self._before_discard()
            except Exception:  # noqa: BLE001 - the discard must happen all the same
                log.exception("replication: before_discard failed")
        changed = sorted(self._written.keys() | self._lagging.keys() | self._renamed)
        # Closed without an fsync: the error was reported once and a retry would claim success.
        for fd in self._fds.values():
            _close_quietly(fd)
        self._fds.clear()
        self._written.clear()
        self._lagging.clear()
        self._cut.clear()
        if self._receiving is not None:
            _close_quietly(self._receiving[1])
            self._receiving = None
        deleted, kept, directories = 0, [], set()
        for rel in changed:
            path = self._path(rel)
            try:
                os.unlink(path)
            except FileNotFoundError:
                continue
            except OSError:
                kept.append(rel)
                continue
            deleted += 1
            directories.add(path.parent)
        # Best effort: if the unlink does not last, the file comes back after a reboot with what the
        # disk holds, which a hash then reads truthfully (the page cache went with the inode).
        for directory in directories:
            try:
                fsync_dir(directory)
            except OSError:
                pass
        detail = f"{deleted} file(s) written since the last commit deleted"
        if kept:
            try:
                files.write_suspects(self.root, files.suspect_files(self.root) | set(kept))
            except OSError as exc:
                log.critical("replication: cannot delete nor mark as suspect %s (%s): until this process "
                             "restarts a full sync copies them again; after a restart remove them by hand",
                             ", ".join(kept), exc)
                detail += f"; {len(kept)} could not be deleted nor marked: {', '.join(kept)}"
            else:
                detail += f"; {len(kept)} could not be deleted, listed in {files.SUSPECT_FILE}: {', '.join(kept)}"
        self._dirs.clear()
        self._renamed.clear()
        return detail


def _write_all(fd: int, data: bytes | memoryview, path: Path) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.EIO, "write made no progress", str(path))
        view = view[written:]


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:  # already failing; the descriptor is released all the same
        pass


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _valid(rel: str) -> bool:
    try:
        proto.check_path(rel)
    except proto.ProtocolError:
        return False
    return True


def _reserve(fd: int, offset: int, length: int) -> None:
    """Reserve blocks as the leader does for its segments: a promoted follower writing through a
    mapping of a sparse file on a full disk would die of SIGBUS."""
    try:
        os.posix_fallocate(fd, offset, length)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise


def apply_batch(applier: FileApplier, operations: list[proto.Operation]) -> None:
    """Apply and commit one batch; raises ReplicaDiskError if any of it is not on disk."""
    for operation in operations:
        applier.apply(operation)
    applier.commit()
