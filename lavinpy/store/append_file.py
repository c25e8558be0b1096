"""A small durable file of a vhost's own beside its queues (MQTT's retained messages): records are
appended, the whole file is replaced now and then, and both take part in the store like its index
files do.

Each append goes to the OS at once (one ``write`` on an O_APPEND descriptor) and to the change feed
(so a replication leader streams it to the followers in order with the store's other changes); the
fsync is the group commit's: under ``always`` the next flush syncs it before its waiters resolve,
under ``batch`` the flush on the batch timer does, and a caller that must know the bytes are durable
(and, in a cluster, on every in-sync follower) waits for ``VhostStore.durable()`` as a publisher
confirm does. No fsync per record.
"""

from __future__ import annotations

import asyncio
import mmap
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from lavinpy.store import changes
from lavinpy.store.jsonfile import FILE_MODE, fsync_dir, tmp_path_for, write_bytes_atomic

WRITE_DELAY_S = 0.02  # append_soon's records wait at most this long for a group commit to write them
_FLAGS = os.O_RDWR | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)


class AppendFile:
    """One file; use from the store's event loop thread. ``close_fd`` closes a descriptor, or later if
    a flush's worker thread may be syncing it (the store's rule for its index files)."""

    def __init__(self, path: Path, close_fd: Callable[[int], None], waits: Callable[[], bool],
                 write_first: Callable[[], None] | None = None,
                 flush_syncs_acks: Callable[[], bool] | None = None) -> None:
        self.path = Path(path)
        self._close_fd = close_fd
        self._waits = waits
        # What must reach the OS before records written outside a group commit (the store's buffered
        # index entries: a deduplication record handed over before its message's entry would, after a
        # kill -9, turn the publisher's retry of a lost message into a "duplicate").
        self._write_first = write_first
        # Whether the group commit being taken syncs the queues' ack files (the store's); with
        # ``sync_with_acks`` set (an owner that can rebuild its unsynced records from the queues, as a
        # queue's deduplication cache from its messages' headers), only such a commit syncs this file:
        # it is still written at every commit (kill -9 and replication see the same bytes), not fsynced.
        self._flush_syncs_acks = flush_syncs_acks
        self.sync_with_acks = False
        self._fd = -1
        self._unsynced = False
        self._pending: list[bytes] = []  # append_soon's records, until a group commit or the delay
        self._due = False  # records wait to be written (append_soon's, or the owner's: write_soon)
        self._pending_since = 0.0  # the loop time of the oldest waiting record
        self._delay_armed = False  # a timer for the waiting records is set
        # How append_soon's records of one turn are written (the owner's framing, e.g. one checksum).
        self.frame: Callable[[bytes], bytes] = bytes
        # What a write of the waiting records appends: append_soon's records joined and framed, or, for
        # an owner that keeps its records itself and calls ``write_soon``, its own rendering of them
        # (b"": nothing to append). One or the other per file.
        self.render: Callable[[], bytes] = self._render_pending

    def open(self) -> bytes:
        """Open (creating it empty) and return what the file holds."""
        if self._fd < 0:
            self._fd = os.open(self.path, _FLAGS, FILE_MODE)
        with open(self.path, "rb") as f:
            return f.read()

    def open_unread(self) -> int:
        """Open (creating it empty) without reading it; its size (read it with ``read_at``)."""
        if self._fd < 0:
            self._fd = os.open(self.path, _FLAGS, FILE_MODE)
        return self.size

    def read_at(self, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes from ``offset`` (fewer at the end of the file)."""
        return os.pread(self._fd, size, offset)

    @property
    def size(self) -> int:
        return os.fstat(self._fd).st_size

    def append(self, data: bytes) -> bool:
        """Add ``data`` at the end; whether a caller that must know it durable waits for the store's
        ``durable()`` (False: with ``fsync: never`` outside a cluster, handed to the OS is all)."""
        self._write(data)
        return self._waits()

    def _write(self, data: bytes) -> None:
        written = os.write(self._fd, data)
        while written < len(data):  # a regular file takes it whole but for a full disk; finish or raise
            written += os.write(self._fd, data[written:])
        if changes.feed.listener is not None:  # (a replication leader's: it streams the bytes)
            changes.appended_fd(self._fd, self.path, data)
        self._unsynced = True

    def append_soon(self, data: bytes) -> None:
        """``append`` soon, with the other records of the moment in one write (many small records,
        one system call): at the store's next group commit or ``durable()`` call, before it syncs, so
        a publisher confirm that waits for them finds them on disk; else after ``WRITE_DELAY_S``."""
        self._pending.append(data)
        if not self._due:
            self._due = True
            self._soon()

    def write_soon(self) -> None:
        """``append_soon`` for an owner that keeps its records itself: its ``render`` is called for
        them at that write (once for all the calls before it)."""
        if self._due:
            return
        self._due = True
        self._soon()

    def _soon(self) -> None:
        """The first record waits: its delay starts (or, outside an event loop, it is written now)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.write_in_order()
            return
        self._pending_since = loop.time()
        if not self._delay_armed:  # one timer for many batches: group commits mostly write them first
            self._delay_armed = True
            loop.call_later(WRITE_DELAY_S, self._on_delay)

    def _on_delay(self) -> None:
        """The delay timer: write what has waited ``WRITE_DELAY_S``; what a group commit wrote meanwhile
        is gone, and what came after it waits its own delay (the timer is set again for that)."""
        self._delay_armed = False
        if not self._due or self._fd < 0:
            return
        loop = asyncio.get_running_loop()
        left = self._pending_since + WRITE_DELAY_S - loop.time()
        if left > 0.001:
            self._delay_armed = True
            loop.call_later(left, self._on_delay)
            return
        self.write_in_order()

    def write_in_order(self) -> None:
        """``write_pending`` outside a group commit: what must go first (``write_first``), then the
        records (a group commit writes the index entries itself before it takes this file's)."""
        if self._due and self._fd >= 0:
            if self._write_first is not None:
                self._write_first()
            self.write_pending()

    def write_pending(self) -> None:
        """Hand the waiting records (``append_soon``'s or ``write_soon``'s) to the OS now."""
        if self._due and self._fd >= 0:
            self._due = False
            data = self.render()
            if data:  # (empty: the owner rewrote the file instead)
                self._write(data)

    def _render_pending(self) -> bytes:
        data = self.frame(b"".join(self._pending))
        self._pending.clear()
        return data

    def truncate(self, size: int) -> None:
        """Cut the file to ``size`` bytes (a torn last record after a crash)."""
        os.ftruncate(self._fd, size)
        changes.truncated(self.path, size)
        self._unsynced = True

    def replace(self, data: bytes) -> bool:
        """Make the file hold exactly ``data``, atomically and durably here (a rewrite that drops
        replaced records); whether a caller waits for ``durable()`` (in a cluster, for the followers)."""
        write_bytes_atomic(self.path, data)  # synced, renamed, reported as a replace
        old, self._fd = self._fd, os.open(self.path, _FLAGS, FILE_MODE)
        self._close_fd(old)
        self._unsynced = False
        return self._waits()

    def replace_from(self, chunks: Iterable[bytes]) -> bool:
        """``replace`` with the new content made a chunk at a time (the chunks may be read from this
        file: it is swapped only once they are all written), never whole in memory here; a replication
        listener is handed it from a read-only map of the new file."""
        tmp = tmp_path_for(self.path)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), FILE_MODE)
        try:
            with open(fd, "wb") as f:
                os.fchmod(fd, FILE_MODE)
                for chunk in chunks:
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(self.path.parent)
        old, self._fd = self._fd, os.open(self.path, _FLAGS, FILE_MODE)
        self._close_fd(old)
        if changes.feed.listener is not None:  # (a replication leader's: it copies what it sends)
            size = self.size
            if not size:
                changes.replaced(self.path, b"")
            else:
                with mmap.mmap(self._fd, size, access=mmap.ACCESS_READ) as mapped:
                    view = memoryview(mapped)
                    try:
                        changes.replaced(self.path, view)
                    finally:
                        view.release()
        self._unsynced = False
        return self._waits()

    # ---- group commit (VhostStore) -------------------------------------------------------------

    @property
    def has_unsynced(self) -> bool:
        return self._unsynced or self._due

    def take_unsynced_fds(self) -> list[int]:
        """The descriptor to fsync in this flush, if anything was written since the last one."""
        self.write_pending()
        if not self._unsynced or self._fd < 0:
            return []
        if self.sync_with_acks and self._flush_syncs_acks is not None and not self._flush_syncs_acks():
            return []  # (still ``has_unsynced``: the store's periodic flush, which syncs acks, comes)
        self._unsynced = False
        return [self._fd]

    def mark_unsynced(self) -> None:
        """A flush that took the descriptor failed: the next one syncs it again."""
        self._unsynced = True

    def close(self, clean: bool = True) -> None:
        if self._fd < 0:
            return
        self.write_pending()
        if clean and self._unsynced:
            os.fsync(self._fd)
            self._unsynced = False
        self._close_fd(self._fd)
        self._fd = -1
