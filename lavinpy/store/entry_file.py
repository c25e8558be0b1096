"""One durable file of fixed-size entries: a queue's ``enq``/``ack``, a stream's ``enq``, a queue's
``delivery_counts``.

The protocol every such file follows, in one place:

- recover: a leftover ``<file>.tmp`` (an interrupted rewrite) is removed, the file is read whole and a
  torn last entry (a write cut short by a crash) is cut off;
- append: whole entries are handed to the OS through an ``O_APPEND`` descriptor (the owner decides
  when: the indexes buffer entries until the group commit, the delivery counts write each at once);
- sync: the store's flush collects the descriptors with ``take_unsynced`` and fsyncs them in its
  worker thread, as its fsync policy says;
- rewrite: the live entries go to ``<file>.tmp``, which is fsynced and renamed over the file, and the
  directory is fsynced, so a crash leaves the old or the new file, never a mix;
- truncate, remove, close.

Every mutation is reported to the change feed (changes.py) the moment it is made, so a replication
follower applies the same operations in the same order. Descriptors are closed through ``close_fd``:
the store defers a close while a flush may still be fsyncing that descriptor.
"""

from __future__ import annotations

import logging
import os
from array import array
from collections.abc import Callable
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


class EntryFile:
    """An append-only file of ``entry_size``-byte entries; ``owner`` (e.g. ``queue 'q'``) names it in logs.

    ``fd`` is -1 while the file is not open. ``size`` is the bytes in the file (written, maybe not
    synced); ``unsynced`` says whether the store's next flush must fsync it.
    """

    __slots__ = ("path", "entry_size", "owner", "fd", "size", "unsynced", "_close_fd")

    def __init__(self, path: Path, entry_size: int, owner: str, *,
                 close_fd: Callable[[int], None] = os.close) -> None:
        self.path = path
        self.entry_size = entry_size
        self.owner = owner
        self._close_fd = close_fd
        self.fd = -1
        self.size = 0
        self.unsynced = False

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
        tmp_path_for(self.path).unlink(missing_ok=True)  # an interrupted rewrite
        flags = _APPEND_FLAGS | os.O_CREAT if create else _APPEND_FLAGS
        try:
            self.fd = os.open(self.path, flags, FILE_MODE)
        except FileNotFoundError:
            if create:
                raise
            return array(typecode)
        fd = self.fd
        size = os.fstat(fd).st_size
        whole = size - size % self.entry_size
        if whole != size:
            log.warning("%s: %s file ends with a partial entry of %d bytes; ignored",
                        self.owner, self.path.name, size - whole)
            os.ftruncate(fd, whole)
        self.size = whole
        if create or whole != size:
            changes.truncated(self.path, whole)
        return self._read(typecode)

    def _read(self, typecode: str) -> array:
        fd = self.fd
        whole = self.size
        entries = array(typecode)
        entries.frombytes(bytes(entries.itemsize))
        entries *= whole // entries.itemsize
        view = memoryview(entries).cast("B")
        done = 0
        while done < whole:  # readinto the array's own buffer: one copy, no temporary bytes
            n = os.preadv(fd, [view[done:]], done)
            if n <= 0:
                raise OSError(f"{self.owner}: {self.path.name} file shrank while being read")
            done += n
        view.release()
        return entries

    def create(self) -> None:
        """Open the file for appending, creating it (and making its name durable) if absent."""
        created = not self.path.exists()
        self.fd = os.open(self.path, _APPEND_FLAGS | os.O_CREAT, FILE_MODE)
        if created:
            fsync_dir(self.path.parent)  # the new name must survive a crash along with its entries

    # ---- appending and syncing ---------------------------------------------------------------

    def append(self, data: Entries) -> int:
        """Hand whole entries to the OS; the bytes written. The next flush fsyncs them."""
        fd = self.fd
        written = _write_all(fd, data)
        if changes.feed.listener is not None:
            changes.appended_fd(fd, self.path, memoryview(data).cast("B"))
        self.size += written
        self.unsynced = True
        return written

    def take_unsynced(self, fds: list[int]) -> None:
        """Add the descriptor to ``fds`` if a flush must fsync it, and count it synced (event-loop thread)."""
        if self.unsynced and self.fd >= 0:
            fds.append(self.fd)
            self.unsynced = False

    def mark_unsynced(self) -> None:
        """A flush failed: the file is not known to be on disk, so the next one syncs it."""
        if self.fd >= 0:
            self.unsynced = True

    def fsync(self) -> None:
        """fsync now (safe in a worker thread)."""
        if self.fd >= 0:
            os.fsync(self.fd)

    # ---- rewriting ---------------------------------------------------------------------------

    def rewrite(self, data: Entries) -> None:
        """Replace the whole file with ``data`` (tmp, fsync, rename, directory fsync) and reopen it.

        The new file is on disk when this returns, so nothing of it is left for a flush to sync.
        """
        write_bytes_atomic(self.path, data)  # reports the replacement to the change feed
        old = self.fd
        self.fd = os.open(self.path, _APPEND_FLAGS | os.O_CREAT, FILE_MODE)
        if old >= 0:
            self._close_fd(old)
        self.size = memoryview(data).nbytes
        self.unsynced = False

    def truncate(self, size: int = 0) -> None:
        """Cut the file to ``size`` bytes. Not synced here: the owner cuts only entries that are
        harmless if a crash brings them back (a queue's acks of entries its rewritten enq dropped)."""
        os.ftruncate(self.fd, size)
        self.size = size
        changes.truncated(self.path, size)

    def remove(self) -> None:
        """Close and delete the file (the directory entry made durable)."""
        self.close()
        if self.path.exists():
            self.path.unlink()
            fsync_dir(self.path.parent)
            changes.deleted(self.path)
        self.size = 0
        self.unsynced = False

    def close(self) -> None:
        """Close the descriptor (through the store: a running flush may still be fsyncing it)."""
        if self.fd >= 0:
            self._close_fd(self.fd)
            self.fd = -1

    def __repr__(self) -> str:
        return f"EntryFile({str(self.path)!r}, size={self.size}, {'open' if self.fd >= 0 else 'closed'})"
