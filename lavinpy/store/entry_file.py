"""One durable file of fixed-size entries: a queue's ``enq``/``ack``, a stream's ``enq``, a queue's
``delivery_counts``.

The protocol every such file follows, in one place:

- recover: a leftover ``<file>.tmp`` (an interrupted rewrite) is removed, a torn last entry (a write
  cut short by a crash) is cut off and the file is read, whole or a bounded part at a time;
- append: whole entries are handed to the OS through an ``O_APPEND`` descriptor (the owner decides
  when: the indexes buffer entries until the group commit, the delivery counts write each at once);
- sync: the store's flush collects the descriptors with ``take_unsynced`` and fsyncs them in its
  worker thread, as its fsync policy says;
- rewrite: the live entries go to ``<file>.tmp`` (whole or a bounded part at a time), which is fsynced
  and renamed over the file, and the directory is fsynced, so a crash leaves the old or the new file,
  never a mix;
- truncate, remove, close.

Every mutation is reported to the change feed (changes.py) the moment it is made, so a replication
follower applies the same operations in the same order. Descriptors are closed through ``close_fd``:
the store defers a close while a flush may still be fsyncing that descriptor.

A file given an ``OpenFiles`` cache holds a descriptor only while it is in use: it is opened on
demand (an append, a truncate, a sync of entries written before it was closed) and closed when it is
the least recently used of more files than the cache's budget, which follows the process's fd limit.
A file closed that way with entries no flush has synced yet is handed by path to ``sync_later`` (the
store's next flush opens and fsyncs it in its worker: Linux syncs a file's dirty pages through any
descriptor), or fsynced before it closes without one, when ``sync_on_close`` says the fsync policy
syncs at all: closing never loses what a flush would have put on disk.
"""

from __future__ import annotations

import logging
import os
import resource
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from lavinpy.store import changes
from lavinpy.store.jsonfile import FILE_MODE, fsync_dir, tmp_path_for, write_bytes_atomic

log = logging.getLogger("lavinpy.store")

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_APPEND_FLAGS = os.O_RDWR | os.O_APPEND | _CLOEXEC

Entries = bytes | memoryview | array


def _write_all(fd: int, data: Entries) -> int:
    """Write every byte of ``data`` (short writes continued); the number of bytes written."""
    view = memoryview(data).cast("B")
    total = len(view)
    done = 0
    while done < total:
        done += os.write(fd, view[done:])
    view.release()
    return total


def fd_budget(share: int = 4, floor: int = 8) -> int:
    """Index descriptors a process may keep open: a ``share``-th of its soft fd limit (the rest is
    for sockets, segments and everything else)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft <= 0:
        soft = 1 << 20
    return max(floor, soft // share)


class OpenFiles:
    """A bounded set of open ``EntryFile`` descriptors, least recently used closed first.

    Use from one event loop thread. ``limit=None``: measured from the fd limit at first use.
    """

    __slots__ = ("_limit", "_open", "closed_idle")

    def __init__(self, limit: int | None = None) -> None:
        self._limit = limit
        self._open: OrderedDict[EntryFile, None] = OrderedDict()
        self.closed_idle = 0  # files closed to stay within the budget (tests, metrics)

    @property
    def limit(self) -> int:
        if self._limit is None:
            self._limit = fd_budget()
        return self._limit

    @limit.setter
    def limit(self, value: int) -> None:
        self._limit = max(1, value)
        self._trim()

    def __len__(self) -> int:
        return len(self._open)

    def opened(self, file: EntryFile) -> None:
        self._open[file] = None
        self._trim()

    def used(self, file: EntryFile) -> None:
        if file in self._open:
            self._open.move_to_end(file)

    def forget(self, file: EntryFile) -> None:
        self._open.pop(file, None)

    def _trim(self) -> None:
        limit = self.limit
        while len(self._open) > limit:
            file, _ = self._open.popitem(last=False)
            self.closed_idle += 1
            file.close_idle()


#: The node's budget of open queue index files (every vhost's), measured from the fd limit.
INDEX_FILES = OpenFiles()


class EntryFile:
    """An append-only file of ``entry_size``-byte entries; ``owner`` (e.g. ``queue 'q'``) names it in logs.

    ``fd`` is -1 while the file is not open. ``size`` is the bytes in the file (written, maybe not
    synced); ``unsynced`` says whether the store's next flush must fsync it. With a ``cache`` the
    descriptor is opened on demand and may be closed between uses (see the module's notes);
    ``on_create`` is called when an append creates the file (its name is not durable yet).
    """

    __slots__ = ("path", "entry_size", "owner", "fd", "size", "unsynced", "_close_fd", "cache",
                 "sync_on_close", "sync_later", "exists", "on_create")

    def __init__(self, path: Path, entry_size: int, owner: str, *,
                 close_fd: Callable[[int], None] = os.close, cache: OpenFiles | None = None) -> None:
        self.path = path
        self.entry_size = entry_size
        self.owner = owner
        self._close_fd = close_fd
        self.cache = cache
        self.sync_on_close = True
        self.sync_later: Callable[[Path], None] | None = None
        self.exists = False  # known to be on disk (recovered or created)
        self.on_create: Callable[[], None] | None = None
        self.fd = -1
        self.size = 0
        self.unsynced = False

    def _open_fd(self) -> int:
        """The descriptor, opened (and the file created) if it is not open."""
        fd = self.fd
        if fd >= 0:
            cache = self.cache
            if cache is not None:
                cache.used(self)
            return fd
        created = not self.exists and not self.path.exists()
        fd = self.fd = os.open(self.path, _APPEND_FLAGS | os.O_CREAT, FILE_MODE)
        self.exists = True
        if self.cache is not None:
            self.cache.opened(self)
        if created and self.on_create is not None:
            self.on_create()
        return self.fd

    def close_idle(self) -> None:
        """Closed by the cache to stay within its budget: entries not synced yet are fsynced first
        (if the policy syncs), so that the next flush, which no longer sees the descriptor, owes nothing."""
        fd = self.fd
        if fd < 0:
            return
        if self.unsynced and self.sync_on_close:
            if self.sync_later is not None:
                self.sync_later(self.path)
            else:
                os.fsync(fd)
            self.unsynced = False
        self.fd = -1
        self._close_fd(fd)

    @property
    def is_open(self) -> bool:
        return self.fd >= 0

    # ---- recovery ----------------------------------------------------------------------------

    def recover(self, typecode: str = "Q", *, create: bool = True) -> array:
        """Open the file and return its whole entries as an ``array(typecode)``.

        ``create``: the file is made if absent, and its size is reported to the change feed (it was
        created, or cut to whole entries). Otherwise an absent file stays absent (empty result, not
        open) and only a cut is reported.
        """
        if not self.open_recovered(create=create):
            return array(typecode)
        return self._read(typecode, 0, self.size)

    def open_recovered(self, *, create: bool = True) -> bool:
        """``recover`` without the reading (``read_chunks`` reads a large file a bounded part at a
        time): whether the file is there, open, ``size`` its whole entries."""
        tmp_path_for(self.path).unlink(missing_ok=True)  # an interrupted rewrite
        flags = _APPEND_FLAGS | os.O_CREAT if create else _APPEND_FLAGS
        try:
            fd = os.open(self.path, flags, FILE_MODE)
        except FileNotFoundError:
            if create:
                raise
            return False
        self.fd = fd
        self.exists = True
        if self.cache is not None:
            self.cache.opened(self)
        size = os.fstat(fd).st_size
        whole = size - size % self.entry_size
        if whole != size:
            log.warning("%s: %s file ends with a partial entry of %d bytes; ignored",
                        self.owner, self.path.name, size - whole)
            os.ftruncate(fd, whole)
        self.size = whole
        if create or whole != size:
            changes.truncated(self.path, whole)
        return True

    def read_chunks(self, entries: int, typecode: str = "Q") -> Iterator[array]:
        """The open file's whole entries (``size`` bytes from its start) in order, in arrays of at most
        ``entries``: a huge file is never in memory whole."""
        step = entries * self.entry_size
        end = self.size
        for start in range(0, end, step):
            yield self._read(typecode, start, min(start + step, end))

    def _read(self, typecode: str, start: int, stop: int) -> array:
        fd = self.fd
        length = stop - start
        entries = array(typecode)
        entries.frombytes(bytes(entries.itemsize))
        entries *= length // entries.itemsize
        view = memoryview(entries).cast("B")
        done = 0
        while done < length:  # readinto the array's own buffer: one copy, no temporary bytes
            n = os.preadv(fd, [view[done:]], start + done)
            if n <= 0:
                raise OSError(f"{self.owner}: {self.path.name} file shrank while being read")
            done += n
        view.release()
        return entries

    def create(self) -> None:
        """Open the file for appending, creating it (and making its name durable) if absent."""
        created = not self.path.exists()
        self.fd = os.open(self.path, _APPEND_FLAGS | os.O_CREAT, FILE_MODE)
        self.exists = True
        if self.cache is not None:
            self.cache.opened(self)
        if created:
            fsync_dir(self.path.parent)  # the new name must survive a crash along with its entries

    # ---- appending and syncing ---------------------------------------------------------------

    def append(self, data: Entries) -> int:
        """Hand whole entries to the OS; the bytes written. The next flush fsyncs them."""
        fd = self._open_fd()
        written = _write_all(fd, data)
        if changes.feed.listener is not None:
            changes.appended_fd(fd, self.path, memoryview(data).cast("B"))
        self.size += written
        self.unsynced = True
        return written

    def take_unsynced(self, fds: list[int]) -> None:
        """Add the descriptor to ``fds`` if a flush must fsync it, and count it synced (event-loop thread)."""
        if self.unsynced and self.fd >= 0:  # closed: handed to sync_later, or a policy that does not sync
            fds.append(self.fd)
            self.unsynced = False

    def mark_unsynced(self) -> None:
        """A flush failed: the file is not known to be on disk, so the next one syncs it."""
        if self.fd >= 0 or self.cache is not None:
            self.unsynced = True

    def fsync(self) -> None:
        """fsync now (a file without a cache: safe in a worker thread; with one: event-loop thread,
        since a closed file with unsynced entries is opened for it)."""
        if self.fd < 0 and self.cache is not None and self.unsynced and self.exists:
            self._open_fd()
        if self.fd >= 0:
            os.fsync(self.fd)

    # ---- rewriting ---------------------------------------------------------------------------

    def rewrite(self, data: Entries) -> None:
        """Replace the whole file with ``data`` (tmp, fsync, rename, directory fsync) and reopen it.

        The new file is on disk when this returns, so nothing of it is left for a flush to sync.
        """
        write_bytes_atomic(self.path, data)  # reports the replacement to the change feed
        self._reopen_rewritten(memoryview(data).nbytes)

    def rewrite_chunks(self, chunks: Iterable[Entries]) -> None:
        """``rewrite`` with the new content given a bounded part at a time (a queue's millions of live
        entries are never in memory twice): the same tmp, fsync, rename and directory fsync.

        The change feed gets the whole file as one replacement, as from ``rewrite``: a follower must
        never hold half of it. Only then are the parts joined (a replication leader holds them anyway).
        """
        path = self.path
        tmp = tmp_path_for(path)
        report: list[bytes] | None = [] if changes.feed.listener is not None else None
        size = 0
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _CLOEXEC, FILE_MODE)
        try:
            os.fchmod(fd, FILE_MODE)  # a leftover .tmp keeps its old mode through O_CREAT
            for chunk in chunks:
                size += _write_all(fd, chunk)
                if report is not None:
                    report.append(bytes(memoryview(chunk).cast("B")))
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)  # the old file stays, whole
            raise
        os.close(fd)
        os.replace(tmp, path)
        fsync_dir(path.parent)
        if report is not None:
            changes.replaced(path, b"".join(report))
        self._reopen_rewritten(size)

    def _reopen_rewritten(self, size: int) -> None:
        self.exists = True
        if self.cache is not None:  # opened again on the next use
            self.close()
        else:
            old = self.fd
            self.fd = os.open(self.path, _APPEND_FLAGS | os.O_CREAT, FILE_MODE)
            if old >= 0:
                self._close_fd(old)
        self.size = size
        self.unsynced = False

    def truncate(self, size: int = 0) -> None:
        """Cut the file to ``size`` bytes. Not synced here: the owner cuts only entries that are
        harmless if a crash brings them back (a queue's acks of entries its rewritten enq dropped)."""
        if self.cache is not None and not self.exists:
            self.size = size
            return  # never written: nothing to cut
        os.ftruncate(self._open_fd(), size)
        self.size = size
        changes.truncated(self.path, size)

    def remove(self) -> None:
        """Close and delete the file (the directory entry made durable)."""
        self.close()
        if self.path.exists():
            self.path.unlink()
            fsync_dir(self.path.parent)
            changes.deleted(self.path)
        self.exists = False
        self.size = 0
        self.unsynced = False

    def close(self) -> None:
        """Close the descriptor (through the store: a running flush may still be fsyncing it)."""
        if self.fd >= 0:
            if self.cache is not None:
                self.cache.forget(self)
            self._close_fd(self.fd)
            self.fd = -1

    def __repr__(self) -> str:
        return f"EntryFile({str(self.path)!r}, size={self.size}, {'open' if self.fd >= 0 else 'closed'})"
