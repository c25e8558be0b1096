"""A stream's index: the log of its message positions, addressed by offset (the first is 1).

On disk a stream's directory holds ``.queue`` (the name), ``enq`` (one 8-byte position per message,
the same entry format as a queue's ``enq``) and ``stream.json`` (where the log starts). Nothing is
ever acked: a stream only loses messages from its head, a whole segment's worth at a time, when
retention trims it.

Offset ``N`` is entry ``N - first_offset`` of the in-memory log, packed in ``array('Q')`` chunks
(8 bytes per message, no Python object per message).

``stream.json`` holds ``first_offset`` and an *anchor*: a position and its offset. Trimming only
rewrites this small file (atomically); the stale head of ``enq`` is dropped later by a compaction
(tmp + fsync + rename). Positions within a stream are unique, so after any crash the anchor is found
in whichever ``enq`` is on disk, and the offsets of every entry follow from it. An entry whose
record is lost (damaged data in the middle of the log) becomes a *hole* (position 0: segment ids
start at 1), so that the offsets after it do not shift.
"""

from __future__ import annotations

import logging
import os
import shutil
from array import array
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from lavinpy.store import changes
from lavinpy.store.datadir import write_name_file
from lavinpy.store.entry_file import EntryFile
from lavinpy.store.jsonfile import fsync_dir, read_json, write_json_atomic
from lavinpy.store.queue_index import ENQ_FILE, QUEUE_NAME_FILE
from lavinpy.store.record import CorruptRecord
from lavinpy.wire.position import ENTRY_SIZE, OFFSET_SHIFT, SEGMENT_MASK, pos_offset, pos_segment

if TYPE_CHECKING:
    from lavinpy.store.message_store import MessageStore

log = logging.getLogger("lavinpy.store")

META_FILE = "stream.json"
HOLE = 0  # an entry whose record is lost; keeps the offsets after it stable
CHUNK_BITS = 12
CHUNK_ENTRIES = 1 << CHUNK_BITS  # 32 KiB per chunk
_CHUNK_MASK = CHUNK_ENTRIES - 1


class _Run:
    """The consecutive entries of the log that live in one segment (a stream's segments never interleave)."""

    __slots__ = ("segment", "count", "refs", "lo")

    def __init__(self, segment: int, count: int, refs: int, lo: int) -> None:
        self.segment = segment  # 0 for a run of holes only
        self.count = count      # entries, holes included
        self.refs = refs        # entries holding a reference on the segment
        self.lo = lo            # byte offset of the run's first record in its segment


class StreamIndex:
    """The position log of one (durable) stream. ``open()`` before use.

    Used by the vhost store's group commit like a ``QueueIndex``: ``write_buffers()``,
    ``take_unsynced_fds()``, ``fsync()``, ``has_pending_writes``, ``has_unsynced``, ``close()``,
    ``delete()``.
    """

    durable = True

    def __init__(self, name: str, messages: MessageStore, directory: Path, *,
                 close_fd: Callable[[int], None] = os.close) -> None:
        self.name = name
        self.messages = messages
        self.directory = Path(directory)
        self._file = EntryFile(self.directory / ENQ_FILE, ENTRY_SIZE, f"stream {name!r}", close_fd=close_fd)
        self._chunks: list[array] = [array("Q")]
        self._head = 0  # entries trimmed off the front of self._chunks[0]
        self._count = 0
        self._first = 1
        self._runs: deque[_Run] = deque()
        self._pending = array("Q")  # appended, not yet handed to the OS
        self._stale = 0  # trimmed entries still at the start of the enq file
        self._is_open = False

    # ---- opening -----------------------------------------------------------------------------

    def open(self) -> None:
        """Load the log, drop what retention already trimmed, validate it, take segment references."""
        if self._is_open:
            return
        self._is_open = True
        directory = self.directory
        created = not directory.exists()
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not (directory / QUEUE_NAME_FILE).exists():
            write_name_file(directory / QUEUE_NAME_FILE, self.name)
        if created:
            fsync_dir(directory.parent)
        entries = self._file.recover()
        meta = read_json(directory / META_FILE, None) or {}
        self._first = int(meta.get("first_offset", 1))
        start = self._locate_first(entries, meta)
        self._stale = start
        if start:
            entries = entries[start:]
        entries, runs, changed = self._validate(entries)
        self.messages.note_references(entries)
        self._set_entries(entries, runs)
        for run in self._runs:
            if run.refs:
                self.messages.incref(run.segment, run.refs)
        if changed:
            self.compact()

    def _locate_first(self, entries: array, meta: dict) -> int:
        """Index in ``entries`` of the entry at ``first_offset`` (the anchor fixes where offsets start)."""
        anchor = meta.get("anchor")
        if not anchor:
            return 0
        anchor_pos, anchor_offset = int(anchor[0]), int(anchor[1])
        try:
            at = entries.index(anchor_pos)
        except ValueError:
            at = -1
        start = at - (anchor_offset - self._first)
        if at < 0 or start < 0:
            log.error("stream %r: the enq file does not hold the entry stream.json names; offsets are "
                      "counted from the start of the file", self.name)
            return 0
        return start

    def _validate(self, entries: array) -> tuple[array, list[_Run] | None, bool]:
        """Entries whose record is gone: cut off at the tail, holes elsewhere.

        Returns (entries, their runs when found on the fast path, whether anything changed).
        """
        if not entries:
            return entries, [], False
        ends = self.messages.valid_ends()
        segs = memoryview(entries).cast("B").cast("I")[0::2]
        offs = memoryview(entries).cast("B").cast("I")[1::2]
        n = len(segs)
        # Fast path: a healthy log is grouped by ascending segment with ascending offsets, so each
        # segment is one bisected run whose last entry is its highest offset.
        runs: list[tuple[int, int, int]] = []
        i = 0
        while i < n:
            segment = segs[i]
            j = bisect_right(segs, segment, i)
            runs.append((segment, i, j))
            i = j
        ok = all(a[0] < b[0] for a, b in zip(runs, runs[1:], strict=False))
        if ok:
            for segment, lo, hi in runs:
                end = ends.get(segment)
                if end is None or offs[hi - 1] >= end or offs[lo] > offs[hi - 1]:
                    ok = False
                    break
        found = [_Run(segment, hi - lo, hi - lo, offs[lo]) for segment, lo, hi in runs] if ok else None
        segs.release()
        offs.release()
        if found is not None:
            return entries, found, False
        # Slow path (after damage or data loss): per entry.
        fixed = array("Q", (p if (p >> OFFSET_SHIFT) < ends.get(p & SEGMENT_MASK, 0) else HOLE for p in entries))
        last = len(fixed)
        while last and fixed[last - 1] == HOLE:
            last -= 1
        if last < len(fixed):
            log.warning("stream %r: dropped %d entries at the tail whose records are gone",
                        self.name, len(fixed) - last)
            del fixed[last:]
        holes = fixed.count(HOLE) - entries.count(HOLE)
        if holes:
            log.warning("stream %r: %d entries point at lost records; their offsets stay empty",
                        self.name, holes)
        return fixed, None, True

    def _set_entries(self, entries: array, runs: list[_Run] | None) -> None:
        self._chunks = [entries[i:i + CHUNK_ENTRIES] for i in range(0, len(entries), CHUNK_ENTRIES)]
        if not self._chunks or len(self._chunks[-1]) >= CHUNK_ENTRIES:
            self._chunks.append(array("Q"))
        self._head = 0
        self._count = len(entries)
        if runs is not None:
            self._runs = deque(runs)
            return
        self._runs = deque()
        for p in entries:  # only after damage: one Python step per entry
            self._track(p)

    def _track(self, pos: int) -> None:
        runs = self._runs
        last = runs[-1] if runs else None
        if pos == HOLE:
            if last is None:
                runs.append(_Run(0, 1, 0, 0))
            else:
                last.count += 1
            return
        segment = pos_segment(pos)
        if last is not None and last.segment == 0:  # leading holes join the first segment's run
            last.segment, last.lo = segment, pos_offset(pos)
        if last is not None and last.segment == segment:
            last.count += 1
            last.refs += 1
        else:
            runs.append(_Run(segment, 1, 1, pos_offset(pos)))

    # ---- the log -----------------------------------------------------------------------------

    def append(self, pos: int) -> int:
        """Add a message (already in the message store) at the tail; returns its offset."""
        tail = self._chunks[-1]
        if len(tail) >= CHUNK_ENTRIES:
            tail = array("Q")
            self._chunks.append(tail)
        tail.append(pos)
        self._pending.append(pos)
        offset = self._first + self._count
        self._count += 1
        segment = pos_segment(pos)
        runs = self._runs
        if runs and runs[-1].segment == segment:
            run = runs[-1]
            run.count += 1
            run.refs += 1
        else:
            runs.append(_Run(segment, 1, 1, pos_offset(pos)))
        self.messages.incref(segment)
        return offset

    def append_many(self, positions: Sequence[int]) -> int:
        """``append`` for positions of one segment (a run stored by one call); returns the first's offset."""
        if not positions:
            return self._first + self._count
        segment = pos_segment(positions[0])
        first = self._first + self._count
        taken = 0
        while taken < len(positions):
            tail = self._chunks[-1]
            if len(tail) >= CHUNK_ENTRIES:
                tail = array("Q")
                self._chunks.append(tail)
            room = CHUNK_ENTRIES - len(tail)
            tail.extend(positions[taken:taken + room])
            taken += room
        self._pending.extend(positions)
        n = len(positions)
        self._count += n
        runs = self._runs
        if runs and runs[-1].segment == segment:
            run = runs[-1]
            run.count += n
            run.refs += n
        else:
            runs.append(_Run(segment, n, n, pos_offset(positions[0])))
        self.messages.incref(segment, n)
        return first

    def get(self, offset: int) -> int | None:
        """The position at ``offset``; None outside the log or for a hole."""
        i = offset - self._first
        if not 0 <= i < self._count:
            return None
        i += self._head
        pos = self._chunks[i >> CHUNK_BITS][i & _CHUNK_MASK]
        return pos or None

    def get_many(self, offset: int, count: int) -> list[int]:
        """The positions of ``count`` consecutive offsets from ``offset`` (0 for a hole), one slice
        per chunk; cut short at the end of the log (empty outside it)."""
        i = offset - self._first
        if i < 0:
            return []
        count = min(count, self._count - i)
        out: list[int] = []
        i += self._head
        chunks = self._chunks
        while count > 0:
            chunk = chunks[i >> CHUNK_BITS]
            lo = i & _CHUNK_MASK
            part = chunk[lo:lo + count].tolist()
            if not part:
                break
            out += part
            count -= len(part)
            i += len(part)
        return out

    @property
    def first_offset(self) -> int:
        return self._first

    @property
    def next_offset(self) -> int:
        """The offset the next appended message gets."""
        return self._first + self._count

    @property
    def last_offset(self) -> int:
        """The newest message's offset (``first_offset - 1`` when the stream is empty)."""
        return self._first + self._count - 1

    @property
    def count(self) -> int:
        return self._count

    def __len__(self) -> int:
        return self._count

    def segments(self) -> list[int]:
        """Ids of the segments the log references, oldest first."""
        return [run.segment for run in self._runs if run.segment]

    def _timestamp_at(self, offset: int, stop: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first readable record at or after ``offset`` and before ``stop``."""
        while offset < stop:
            pos = self.get(offset)
            if pos is not None:
                try:
                    return offset, self.messages.read(pos).timestamp
                except (KeyError, CorruptRecord):
                    pass
            offset += 1
        return None

    def offset_for_timestamp(self, ts_ms: int) -> int:
        """The first offset whose record was stored at or after ``ts_ms`` (``next_offset`` if none).

        Records are appended in time order, so this is a binary search reading one timestamp per step.
        """
        lo, hi = self._first, self.next_offset
        while lo < hi:
            mid = (lo + hi) // 2
            found = self._timestamp_at(mid, hi)
            if found is None or found[1] >= ts_ms:
                hi = mid
            else:
                lo = found[0] + 1
        return lo

    # ---- retention ---------------------------------------------------------------------------

    def _run_spans(self) -> list[int]:
        """Bytes each run keeps alive: from its first record to the end of its segment's data."""
        ends = self.messages.valid_ends()
        return [max(ends.get(run.segment, run.lo) - run.lo, 0) if run.segment else 0 for run in self._runs]

    @property
    def byte_size(self) -> int:
        """Approximate bytes of the stream's records (segment data from its first record in each segment)."""
        return sum(self._run_spans())

    def trim(self, max_bytes: int | None, max_age_ms: int | None, now_ms: int) -> int:
        """Retention: drop whole segments' worth of entries from the head; returns how many entries.

        The newest segment of the stream always stays. By size: the oldest segments go while the
        stream is larger than ``max_bytes``. By age: a segment goes when its newest record is older
        than ``now_ms - max_age_ms``.
        """
        runs = self._runs
        keep_last = len(runs) - 1
        drop = 0
        if max_bytes is not None and keep_last > 0:
            spans = self._run_spans()
            total = sum(spans)
            while drop < keep_last and total > max_bytes:
                total -= spans[drop]
                drop += 1
        if max_age_ms is not None:
            cutoff = now_ms - max_age_ms
            end = self._first + sum(runs[i].count for i in range(drop))
            i = drop
            while i < keep_last:
                start, end = end, end + runs[i].count
                newest = self._newest_timestamp(start, end)
                if newest is not None and newest >= cutoff:
                    break
                i += 1
            drop = i
        if not drop:
            return 0
        return self._drop_head(drop)

    def _newest_timestamp(self, start: int, stop: int) -> int | None:
        for offset in range(stop - 1, start - 1, -1):
            pos = self.get(offset)
            if pos is not None:
                try:
                    return self.messages.read(pos).timestamp
                except (KeyError, CorruptRecord):
                    continue
        return None

    def _drop_head(self, nruns: int) -> int:
        dropped = [self._runs.popleft() for _ in range(nruns)]
        k = sum(run.count for run in dropped)
        new_first = self._first + k
        # The stream's last run is never dropped and ends with a readable entry, so an anchor exists.
        anchor_offset = new_first
        while self.get(anchor_offset) is None:
            anchor_offset += 1
        anchor = [self.get(anchor_offset), anchor_offset]
        # The anchor must be in the enq file on disk before stream.json names it.
        self.write_buffers()
        self.fsync()
        # Made durable before any segment can be deleted: a restart then never looks for them.
        write_json_atomic(self.directory / META_FILE, {"first_offset": new_first, "anchor": anchor})
        self._first = new_first
        self._count -= k
        self._head += k
        while self._head >= CHUNK_ENTRIES and len(self._chunks) > 1:
            self._chunks.pop(0)
            self._head -= CHUNK_ENTRIES
        self._stale += k
        if self._stale > self._count:  # amortised: the file is rewritten after as many trims as it holds
            self.compact()
        for run in dropped:
            if run.refs:
                self.messages.decref(run.segment, run.refs)
        return k

    def _live(self) -> array:
        out = array("Q")
        head = self._head
        for chunk in self._chunks:
            out.extend(chunk[head:] if head else chunk)
            head = 0
        return out

    def compact(self) -> None:
        """Rewrite ``enq`` with the live entries only (crash-safe: tmp, fsync, rename)."""
        if not self._file.is_open:
            return
        self._file.rewrite(self._live())
        del self._pending[:]  # the new file holds them, synced
        self._stale = 0

    # ---- durability (the vhost store's group commit) -----------------------------------------

    @property
    def has_pending_writes(self) -> bool:
        return bool(self._pending)

    @property
    def has_unsynced(self) -> bool:
        """Bytes handed to the OS that a flush has not fsynced yet."""
        return self._file.unsynced

    def write_buffers(self) -> None:
        """Hand the appended entries to the OS (event-loop thread)."""
        if self._pending and self._file.is_open:
            self._file.append(self._pending)
            del self._pending[:]

    def take_unsynced_fds(self, include_acks: bool = True) -> list[int]:
        """Descriptors a flush must fsync; clears ``has_unsynced`` (event-loop thread).

        A stream has no ack file, so ``include_acks`` changes nothing.
        """
        fds: list[int] = []
        self._file.take_unsynced(fds)
        return fds

    def mark_unsynced(self) -> None:
        self._file.mark_unsynced()

    def fsync(self) -> None:
        self._file.fsync()

    # ---- life cycle --------------------------------------------------------------------------

    def ensure_directory(self) -> None:
        """A stream's directory is made when it is opened (the queue index's makes its on first write)."""

    def close(self, clean: bool = True) -> None:
        """Close the file. Clean: write buffers, drop the trimmed head from the file, fsync."""
        file = self._file
        if file.is_open:
            self.write_buffers()
            if clean:
                if self._stale:
                    self.compact()
                file.fsync()
                file.unsynced = False
            file.close()
        self._is_open = False

    def delete(self) -> None:
        """Drop every entry (releasing the segment references), close, remove the directory."""
        runs, self._runs = self._runs, deque()
        self._chunks = [array("Q")]
        self._head = self._count = 0
        del self._pending[:]
        self._file.close()
        self._is_open = False
        for run in runs:
            if run.refs:
                self.messages.decref(run.segment, run.refs)
        shutil.rmtree(self.directory, ignore_errors=True)
        if self.directory.parent.exists():
            fsync_dir(self.directory.parent)
        changes.dir_deleted(self.directory)

    def __repr__(self) -> str:
        return f"StreamIndex({self.name!r}, offsets {self._first}..{self.next_offset - 1}, count={self._count})"

