"""How often each message of a queue was returned to it (``x-delivery-count``), kept across restarts.

A durable queue that has had a message returned (nack/reject with requeue, channel closed with
unacked messages) gets a ``delivery_counts`` file next to its ``enq``/``ack`` files: append-only
16-byte entries, ``position u64, count u32, crc32 u32`` (little-endian; the CRC covers the first 12
bytes), and the last entry for a position wins. Queues that never had a message returned have no
file and pay nothing.

- Each new count is written to the file (``os.write``) before the message is ready again, so a
  killed process never loses one. The file is fsynced by the store's flushes, like the ack files:
  after a power loss a message may have the count of its last synced entry (lower, never reset).
- Acks write nothing here: the broker forgets the count in memory, and the entry is dropped when the
  file is compacted. Compaction happens when the file outgrows the live counts, and at a clean close;
  it first makes the queue's acks durable (``sync_removals``), so an entry is never dropped while
  its message could still come back after a crash.
- On open, entries whose message is no longer in the queue (acked before a crash) are ignored, as
  are a torn last entry and any entry that fails its CRC.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path

from lavinpy.store.entry_file import EntryFile

log = logging.getLogger("lavinpy.store")

COUNTS_FILE = "delivery_counts"
RETRY_DUE_FILE = "retry_due"
ENTRY = struct.Struct("<QII")  # position, count, crc32 of the first 12 bytes
_KEY = struct.Struct("<QI")
COMPACT_MIN_ENTRIES = 4096  # 64 KiB: below this the file is never rewritten while running
MAX_COUNT = 0xFFFFFFFF


def pack_entry(pos: int, count: int) -> bytes:
    key = _KEY.pack(pos, count)
    return ENTRY.pack(pos, count, zlib.crc32(key))


class DeliveryCounts:
    """The delivery counts of one queue: ``counts`` (position -> times returned) and its file.

    ``directory=None`` keeps them in memory only (a transient queue). The broker reads and pops
    ``counts`` directly (a dict: its truth test is the only cost for queues without counts) and
    calls ``set`` for every new count. ``RetryDueTimes`` is the same file kind with 64-bit values.
    """

    FILE = COUNTS_FILE
    ENTRY = ENTRY
    KEY = _KEY
    MAX_VALUE = MAX_COUNT

    @classmethod
    def pack_entry(cls, pos: int, value: int) -> bytes:
        key = cls.KEY.pack(pos, value)
        return cls.ENTRY.pack(pos, value, zlib.crc32(key))

    def __init__(self, name: str, directory: Path | None, *,
                 sync_removals: Callable[[], None] = lambda: None,
                 close_fd: Callable[[int], None] = os.close,
                 compact_min_entries: int = COMPACT_MIN_ENTRIES,
                 prepare_directory: Callable[[], None] = lambda: None) -> None:
        self.name = name
        self.directory = Path(directory) if directory is not None else None
        self.durable = directory is not None
        self.counts: dict[int, int] = {}
        self._sync_removals = sync_removals
        self._prepare_directory = prepare_directory  # the queue's directory is made by its first write
        self._compact_min = compact_min_entries
        self._file = (EntryFile(self.directory / self.FILE, self.ENTRY.size, f"queue {name!r}", close_fd=close_fd)
                      if self.directory is not None else None)

    @property
    def has_unsynced(self) -> bool:
        """Entries written that a flush has not fsynced yet."""
        return self._file is not None and self._file.unsynced

    # ---- opening -----------------------------------------------------------------------------

    def open(self, live: Iterable[int] | None = None) -> None:
        """Load the file, if any; ``live`` (the queue's positions) filters out removed messages."""
        if self._file is None:
            return
        data = self._file.recover("B", create=False)  # no file until a message is returned
        counts = self.counts
        bad = 0
        key = self.KEY
        for pos, count, crc in self.ENTRY.iter_unpack(memoryview(data)):
            if zlib.crc32(key.pack(pos, count)) != crc:
                bad += 1
                continue
            counts[pos] = count
        if bad:
            log.warning("queue %r: %d damaged entries in %s ignored", self.name, bad, self.FILE)
        if counts and live is not None:
            kept = set(counts).intersection(live)  # one pass over the queue, only when counts exist
            for pos in [pos for pos in counts if pos not in kept]:
                del counts[pos]  # acked before the stop: its message is gone

    # ---- counting ----------------------------------------------------------------------------

    def set(self, pos: int, count: int) -> None:
        """Record a new count; on return it is in the file (the OS has it: a killed process keeps it)."""
        count = min(count, self.MAX_VALUE)
        self.counts[pos] = count
        file = self._file
        if file is None:
            return
        if not file.is_open:
            self._prepare_directory()
            file.create()
        file.append(self.pack_entry(pos, count))
        if file.size >= max(self._compact_min, 2 * len(self.counts)) * self.ENTRY.size:
            self.compact()

    # ---- flushing (the vhost store's group commit) -------------------------------------------

    def take_unsynced_fds(self) -> list[int]:
        """The descriptor a flush must fsync, marked synced (event-loop thread)."""
        fds: list[int] = []
        if self._file is not None:
            self._file.take_unsynced(fds)
        return fds

    def mark_unsynced(self) -> None:
        """A flush failed: the next one syncs the file again."""
        if self._file is not None:
            self._file.mark_unsynced()

    # ---- compaction and life cycle -----------------------------------------------------------

    def compact(self) -> None:
        """Rewrite the file with the live counts only (tmp, fsync, rename); no file when none."""
        file = self._file
        if file is None:
            return
        # A count is forgotten when its message is acked: the ack must be durable before the entry
        # goes, or a crash would bring the message back with a count of zero.
        self._sync_removals()
        if not self.counts:
            file.remove()
            return
        pack = self.pack_entry
        file.rewrite(b"".join(pack(pos, count) for pos, count in self.counts.items()))

    def close(self, clean: bool = True) -> None:
        """Clean: compact (the queue's index is closed and synced first). Otherwise as a crash leaves it."""
        if self._file is None:
            return
        if clean and (self._file.size or self.counts):
            self.compact()
        self._file.close()

    def delete(self) -> None:
        """The queue is deleted (its directory goes with its index)."""
        self.counts.clear()
        if self._file is not None:
            self._file.close()

    def __repr__(self) -> str:
        kind = "durable" if self.durable else "transient"
        return f"{type(self).__name__}({self.name!r}, {kind}, counts={len(self.counts)})"


class RetryDueTimes(DeliveryCounts):
    """When each message a queue holds for a delayed retry is due (ms since the epoch): the delivery
    counts' file protocol in its own ``retry_due`` file, entries ``position u64, due u64, crc32 u32``.
    A due time is on file before the message is held; a message released or acked is forgotten in
    memory and its entry dropped by compaction (an entry left behind is at most one due in the past)."""

    FILE = RETRY_DUE_FILE
    ENTRY = struct.Struct("<QQI")
    KEY = struct.Struct("<QQ")
    MAX_VALUE = (1 << 64) - 1
