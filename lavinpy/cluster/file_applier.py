"""A follower's writes: the leader's operations applied under the data directory, made durable on
``commit()`` (blocking; called from the replication client's own thread)."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import replication_protocol as proto

_FSYNCS = ThreadPoolExecutor(4, thread_name_prefix="replication-fsync")
MAX_OPEN = 64  # descriptors kept open between batches
_FILE_FLAGS = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)


class FileApplier:
    """Applies operations under a data directory and makes them durable on ``commit()`` (blocking)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._fds: dict[str, int] = {}  # open across commits: the same few files take every batch
        self._written: set[int] = set()  # descriptors written since the last commit
        self._dirs: set[Path] = set()  # directories whose entries changed
        self._receiving: tuple[str, int, int] | None = None  # full sync: (path, fd of its .tmp, offset)

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
        self._written.add(fd)
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
            self._written.discard(fd)  # the file is about to be deleted or replaced
            os.close(fd)

    def apply(self, operation: proto.Operation) -> None:
        kind, rel = operation.kind, operation.path
        if kind == proto.OP_WRITE:
            os.pwrite(self._fd(rel), operation.data, operation.offset)
        elif kind == proto.OP_TRUNCATE:
            fd = self._fd(rel)
            grown = operation.size - os.fstat(fd).st_size
            os.ftruncate(fd, operation.size)
            if grown > 0:
                _reserve(fd, operation.size - grown, grown)
        elif kind == proto.OP_REPLACE:
            self._forget(rel)
            self.replace(rel, operation.data)
        elif kind == proto.OP_DELETE:
            self.delete(rel)
        elif kind == proto.OP_RMDIR:
            self._forget(rel)
            path = self._path(rel)
            shutil.rmtree(path, ignore_errors=True)
            self._dirs.add(path.parent)

    def replace(self, rel: str, data: bytes) -> None:
        path = self._path(rel)
        self._make_parent(path)
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        self._dirs.add(path.parent)

    def delete(self, rel: str) -> None:
        self._forget(rel)
        path = self._path(rel)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            self._dirs.add(path.parent)
            parent = path.parent  # directories the leader no longer has are emptied and removed
            while parent != self.root and not any(parent.iterdir()):
                parent.rmdir()
                self._dirs.add(parent.parent)
                parent = parent.parent

    # full sync: a file arrives in chunks into <name>.tmp and is renamed over its name at the end
    def begin_file(self, rel: str, size: int = 0) -> None:
        self._forget(rel)
        path = self._path(rel)
        self._make_parent(path)
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o600)
        self._receiving = (rel, fd, 0)
        if size:
            _reserve(fd, 0, size)

    def file_chunk(self, data: bytes) -> None:
        if self._receiving is None:
            raise proto.ProtocolError("file data outside a file")
        rel, fd, offset = self._receiving
        view = memoryview(data)
        while view:
            n = os.pwrite(fd, view, offset)
            offset += n
            view = view[n:]
        self._receiving = (rel, fd, offset)

    def end_file(self) -> None:
        if self._receiving is None:
            raise proto.ProtocolError("file end outside a file")
        (rel, fd, received), self._receiving = self._receiving, None
        path = self._path(rel)
        try:
            os.ftruncate(fd, received)  # the reservation was for the size announced
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(path.with_name(path.name + ".tmp"), path)
        self._dirs.add(path.parent)

    def commit(self) -> None:
        """fsync every file and directory changed since the last commit."""
        fds, self._written = list(self._written), set()
        if len(fds) > 1:  # at once: one journal commit can then cover them all
            list(_FSYNCS.map(os.fsync, fds))
        elif fds:
            os.fsync(fds[0])
        if len(self._fds) > MAX_OPEN:
            self.close_files()
        for directory in sorted(self._dirs, key=lambda p: len(p.parts), reverse=True):
            try:
                fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
            except FileNotFoundError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self._dirs.clear()

    def close_files(self) -> None:
        """Close the open descriptors (after a commit: nothing written is left unsynced)."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def abort(self) -> None:
        if self._receiving is not None:
            os.close(self._receiving[1])
            self._receiving = None
        self.commit()
        self.close_files()


def _reserve(fd: int, offset: int, length: int) -> None:
    """Reserve blocks as the leader does for its segments: a promoted follower writing through a
    mapping of a sparse file on a full disk would die of SIGBUS."""
    try:
        os.posix_fallocate(fd, offset, length)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise


def apply_batch(applier: FileApplier, operations: list[proto.Operation]) -> None:
    for operation in operations:
        applier.apply(operation)
    applier.commit()
