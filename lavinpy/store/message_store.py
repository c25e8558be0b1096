"""A vhost's message store: its shared ``msgs.*`` segments, appends, reads and segment lifetimes.

A message is written once, whatever the number of queues it is routed to; queue indexes hold its position
and count as references to its segment. A segment is deleted when nothing references it and it is not the
one being written. Threading: everything runs on the event loop thread except ``sync_ranges``, which the
vhost store's group commit runs in a worker thread while deletions are held.
"""

from __future__ import annotations

import logging
import mmap
import os
import re
import struct
import time
from array import array
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from lavinpy.store.accel import cstore
from lavinpy.store.record import (
    FIXED_PAYLOAD,
    HEADER,
    HEADER_SIZE,
    CorruptRecord,
    StoredMessage,
    crc32,
    encode_names,
    file_write_run,
    py_write_encoded,
    read_in_place,
    read_record,
    read_run,
    total_size,
    write_encoded,
    write_run,
)
from lavinpy.store.reserved_record import ReservedRecord
from lavinpy.store.segment import DATA_START, READ_KEEP_MAPPED, Segment, SegmentError, open_ranges, segment_name
from lavinpy.store.segment_files import SegmentFiles
from lavinpy.wire.position import OFFSET_SHIFT, SEGMENT_MASK, pos_offset, pos_segment

log = logging.getLogger("lavinpy.store")

DEFAULT_SEGMENT_SIZE = 8 * 1024 * 1024
_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)
# The current segment keeps at most this much written data mapped behind the write position (twice
# this before a release): the newest records are the ones a consumer reads back soonest. 256 KiB holds
# 256 in-flight 1 KiB messages; each 256 KiB more kept was as much more RSS peak in every busy broker
# (a consumer further behind maps released pages in again from the page cache).
_KEEP_MAPPED = 256 * 1024
_READ_BEHIND = 2 * READ_KEEP_MAPPED  # see Segment.read_through
SEGMENT_FILE = re.compile(r"msgs\.(\d{10})")  # a segment's name (segment_name)
_NAME_CACHE_MAX = 4096  # (exchange, routing key) pairs kept encoded; cleared when full
# header + timestamp + body size; the names' length bytes are inside the encoded names
_OVERHEAD = HEADER_SIZE + FIXED_PAYLOAD - 2
# Bodies from this size on are written the large way (see _prepare_large): their pages faulted in
# with one system call first, written through record.py (whose CRC is the compiled carry-less one
# where the CPU has it, else zlib's), the body a slice of the mapping when read back.
LARGE_BODY = 256 * 1024
LARGE_RUN = 64 * 1024  # a run whose first body is this large is written with pwritev (record.file_write_run)
# Smaller runs from 8 KiB, compiled: one buffer, two pwrites (a write fault a page of the mapping cost
_PWRITE_RUN = getattr(cstore, "pwrite_run", None)  # more; below two pages, those two calls more). Same bytes.
# madvise(MADV_POPULATE_WRITE), Linux 5.14: maps a range's pages writable in one call instead of a
# page fault per 4 KiB page during the copy. Older kernels refuse it (EINVAL): the copy faults as before.
_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
_PAGE = mmap.PAGESIZE
_I64, _U64 = struct.Struct("<q"), struct.Struct("<Q")

__all__ = ["MessageStore", "MissingRecord", "CorruptRecord", "StoredMessage", "DirtyRange"]

DirtyRange = tuple[Segment, int, int]


class MissingRecord(KeyError):
    """The position points at a segment that is gone or past the valid data of its segment."""

    def __str__(self) -> str:  # KeyError would show the message quoted
        return str(self.args[0]) if self.args else ""


class MessageStore:
    """The ``msgs.NNNNNNNNNN`` segments of one vhost directory."""

    def __init__(self, path: Path, segment_size: int = DEFAULT_SEGMENT_SIZE) -> None:
        if not DATA_START + HEADER_SIZE + FIXED_PAYLOAD <= segment_size < 1 << 32:
            raise ValueError(f"segment_size {segment_size} out of range")
        self.path = Path(path)
        self.segment_size = segment_size
        self._segments: dict[int, Segment] = {}
        self._ends: dict[int, int] = {}  # valid end of each sealed segment
        self._refs: dict[int, int] = {}
        self._names: dict[tuple[str, str], bytes] = {}
        self._next_id = 1
        # The segment being written, unpacked into attributes for the hot path.
        self._cur: Segment | None = None
        self._cur_id = 0
        self._mm: mmap.mmap | None = None
        self._kept_from = 0  # the current segment's pages before this are released (page-aligned)
        self._wpos = DATA_START
        self._cur_size = 0
        # Written but not yet synced: sealed segments' ranges, and where the current one's starts.
        self._dirty: list[DirtyRange] = []
        self._dirty_start = -1
        # Until delete_unreferenced() the queues have not told us their references yet.
        self._recovering = True
        self._held = 0
        self._pending_deletes: set[int] = set()
        # Recovery only: (start, end) of unresolved bytes after the current segment's last valid
        # record, and whether an index references them.
        self._tail: tuple[int, int] | None = None
        self._tail_referenced = False
        self._files = SegmentFiles(self.path)  # the next segment made ahead, removals: off the loop

    # ---- lifecycle -------------------------------------------------------------------------------

    def open(self) -> None:
        """Map the existing segments (the newest one is written to) or create the first one."""
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._files.remove_leftovers()
        ids = sorted(int(m.group(1)) for p in self.path.iterdir() if (m := SEGMENT_FILE.fullmatch(p.name)))
        for segment_id in ids:
            try:
                self._segments[segment_id] = Segment.open(self.path, segment_id)
            except (SegmentError, OSError, ValueError) as exc:
                log.error("%s: cannot open message segment, treating it as missing: %s",
                          self.path / segment_name(segment_id), exc)
        self._next_id = (ids[-1] + 1) if ids else 1
        for segment_id, segment in self._segments.items():
            if segment_id != ids[-1]:
                self._ends[segment_id] = segment.data_end()
                if _DONTNEED is not None:
                    # the tail it read leaves the mapping at once (as a sealed segment's pages do): with
                    # thousands of segments those tails were hundreds of MB of RSS during recovery
                    segment.mm.madvise(_DONTNEED)
        newest = self._segments.get(ids[-1]) if ids else None
        if newest is not None:
            valid_end, data_end = newest.scan()
            # Bytes after the last valid record: a torn write, unless an index points into them (then
            # a damaged record). Decided in delete_unreferenced(), once every index has been loaded;
            # until then they count as valid data so that the indexes keep their entries.
            self._set_current(newest, data_end)
            if data_end > valid_end:
                self._tail = (valid_end, data_end)
        else:  # none yet, or the newest file is unusable: start a fresh one after it
            self._set_current(self._create_segment(self.segment_size), DATA_START)
        log.debug("%s: %d message segments, writing %s at %d", self.path, len(self._segments),
                  segment_name(self._cur_id), self._wpos)

    def close(self) -> None:
        """Unmap and close every segment (the store must be opened again to be used)."""
        self._files.close()
        for segment in self._segments.values():
            segment.close()
        self._segments.clear()
        self._ends.clear()
        self._dirty.clear()
        self._dirty_start = -1
        self._pending_deletes.clear()
        self._cur = self._mm = None
        self._cur_size = 0

    # ---- writing ---------------------------------------------------------------------------------

    def append(self, exchange: str, routing_key: str, properties: bytes, body: bytes | memoryview,
               timestamp_ms: int | None = None) -> int:
        """Write a message record and return its position.

        The caller increfs the segment (by pushing the position to queue indexes) before the next
        append: a segment left behind with no reference is deleted when the writer rolls over.
        """
        names = self._names.get((exchange, routing_key))
        if names is None:
            names = self._encode_names(exchange, routing_key)
        if timestamp_ms is None:
            timestamp_ms = time.time_ns() // 1_000_000
        offset = self._wpos
        end = offset + _OVERHEAD + len(names) + len(properties) + len(body)
        if end > self._cur_size:
            self._roll(end - offset)
            offset = self._wpos
            end = offset + _OVERHEAD + len(names) + len(properties) + len(body)
        if len(body) >= LARGE_BODY:
            self._populate(offset, end)
            py_write_encoded(self._mm, offset, names, properties, body, timestamp_ms)  # type: ignore[arg-type]
        else:
            write_encoded(self._mm, offset, names, properties, body, timestamp_ms)
        self._wpos = end
        if end - self._kept_from > 2 * _KEEP_MAPPED and _DONTNEED is not None:
            self._release_written(end)
        if self._dirty_start < 0:
            self._dirty_start = offset
        return self._cur_id | (offset << OFFSET_SHIFT)  # make_pos inlined: once per publish

    def append_run(self, exchange: str, routing_key: str, properties: bytes | list[bytes], bodies: list[bytes],
                   start: int, timestamp_ms: int) -> tuple[int, array, int, int, int]:
        """Write ``bodies[start:]`` as records with the same names and properties, in one call, up to
        the end of the current segment (rolling first when not even the first one fits).

        Returns (index of the first body not written, positions of those written, their body bytes
        in total, the smallest and the largest of them: for the size histogram). As with ``append``,
        the caller pushes the positions to queue indexes before the next append (a run that spans
        segments comes back in pieces; a compiled write takes at most 256 KiB a call).
        ``properties`` is one block for every record, or a list with one per body (a run whose
        messages differ only in properties that do not route).
        """
        names = self._names.get((exchange, routing_key)) or self._encode_names(exchange, routing_key)
        varied = properties if isinstance(properties, list) else None
        props_size = len(properties) if varied is None else len(varied[start])
        offset = self._wpos
        first_end = offset + _OVERHEAD + len(names) + props_size + len(bodies[start])
        if first_end > self._cur_size:
            self._roll(first_end - offset)
            offset = self._wpos
        size = len(bodies[start])  # into the file: a large run; one of 8 KiB or more where compiled
        write = file_write_run if size >= LARGE_RUN else _PWRITE_RUN if size * (len(bodies) - start) >= 8192 else None
        if write is not None:  # into the file: no page of these records faulted into the mapping
            assert self._cur is not None
            done, end, packed, smallest, largest = write(self._cur.fileno(), offset, self._cur_size, self._cur_id,
                                                         names, properties, bodies, start, timestamp_ms)
        else:
            done, end, packed, smallest, largest = write_run(self._mm, offset, self._cur_size, self._cur_id,
                                                             names, properties, bodies, start, timestamp_ms)
        self._wpos = end
        if end - self._kept_from > 2 * _KEEP_MAPPED and _DONTNEED is not None:
            self._release_written(end)
        if self._dirty_start < 0:
            self._dirty_start = offset
        positions = array("Q")
        positions.frombytes(packed)
        # Each record is its fixed part plus its body, so the bodies' total needs no pass either.
        blocks = total_size(varied, start, done) if varied is not None else (done - start) * props_size
        body_bytes = end - offset - (done - start) * (_OVERHEAD + len(names)) - blocks
        return done, positions, body_bytes, smallest, largest

    def reserve(self, exchange: str, routing_key: str, properties: bytes, body_size: int,
                timestamp_ms: int | None = None) -> ReservedRecord:
        """Reserve a record whose body is written piece by piece (see reserved_record.py): its header,
        names and properties are written now and the write position moves past the whole record."""
        names = self._names.get((exchange, routing_key))
        if names is None:
            names = self._encode_names(exchange, routing_key)
        if timestamp_ms is None:
            timestamp_ms = time.time_ns() // 1_000_000
        head = _I64.pack(timestamp_ms) + names + properties + _U64.pack(body_size)
        total = HEADER_SIZE + len(head) + body_size
        offset = self._wpos
        if offset + total > self._cur_size:
            self._roll(total)
            offset = self._wpos
        mm, segment = self._mm, self._cur
        assert mm is not None and segment is not None
        body_start = offset + HEADER_SIZE + len(head)
        mm[offset + HEADER_SIZE:body_start] = head
        # the length now, the CRC (zero until then) when the body is complete: a scan can step over it
        HEADER.pack_into(mm, offset, total - HEADER_SIZE, 0)
        self._wpos = offset + total
        if offset - self._kept_from > 2 * _KEEP_MAPPED and _DONTNEED is not None:
            self._release_written(offset)
        if self._dirty_start < 0:
            self._dirty_start = offset
        self.incref(segment.id)  # held by the reservation: a sealed segment is not deleted under it
        return ReservedRecord(self, segment, offset, body_start, offset + total, crc32(head, 0), crc32)

    def reserved_written(self, record: ReservedRecord) -> None:
        """A reserved record was sealed: its bytes go with the next sync (again, if a sync took part of
        them meanwhile)."""
        segment = record.segment
        if segment is self._cur:
            if self._dirty_start < 0 or record.offset < self._dirty_start:
                self._dirty_start = record.offset
        elif segment.id in self._segments:
            self._dirty.append((segment, record.offset, record.end))

    def _populate(self, start: int, end: int) -> None:
        """Fault in the current segment's pages for [start, end) (clipped to the segment) at once."""
        mm = self._mm
        if mm is None or not _POPULATE_WRITE:
            return
        first = start - start % _PAGE
        end = min(end, self._cur_size)
        if end <= first:
            return
        try:
            mm.madvise(_POPULATE_WRITE, first, end - first)
        except (OSError, ValueError):  # an older kernel: the copy faults the pages in as before
            pass

    def _encode_names(self, exchange: str, routing_key: str) -> bytes:
        names = encode_names(exchange.encode(), routing_key.encode())
        if len(self._names) >= _NAME_CACHE_MAX:
            self._names.clear()
        self._names[(exchange, routing_key)] = names
        return names

    def _roll(self, record_total: int) -> None:
        """Seal the current segment and start a new one big enough for a record of this size."""
        size = self.segment_size
        if record_total > size - DATA_START:  # oversized message: a segment of its own
            size = DATA_START + record_total
            if size >= 1 << 32:
                raise ValueError(f"message record of {record_total} bytes is too large for a segment")
        new = self._create_segment(size)  # first, so a failure (disk full) leaves the state as it was
        old = self._cur
        assert old is not None
        self._ends[old.id] = self._wpos
        if self._dirty_start >= 0:
            self._dirty.append((old, self._dirty_start, self._wpos))
        self._set_current(new, DATA_START)
        if size > self.segment_size:  # big bodies: the next one likely as big, made ahead now
            self._files.prepare(self._next_id, size)
        if not self._refs.get(old.id):
            self._maybe_delete(old.id)
        elif _DONTNEED is not None:
            old.mm.madvise(_DONTNEED)  # sealed: its pages leave the RSS now (see release_memory)

    def _create_segment(self, size: int) -> Segment:
        segment = self._files.take(self._next_id, size) or Segment.create(self.path, self._next_id, size)
        self._next_id += 1
        self._segments[segment.id] = segment
        return segment

    def _release_written(self, end: int) -> None:
        """Drop the current segment's pages written more than _KEEP_MAPPED ago from this process's
        mapping (a later read maps them in again from the page cache; see release_memory)."""
        upto = (end - _KEEP_MAPPED) & ~(mmap.PAGESIZE - 1)
        assert self._mm is not None and _DONTNEED is not None
        self._mm.madvise(_DONTNEED, self._kept_from, upto - self._kept_from)
        self._kept_from = upto
        if end > self._cur_size // 2 and not self._files.preparing:  # the next segment made ahead
            self._files.prepare(self._next_id, self.segment_size)

    def _set_current(self, segment: Segment, write_pos: int) -> None:
        self._kept_from = 0
        self._cur = segment
        self._cur_id = segment.id
        self._mm = segment.mm
        self._cur_size = segment.size
        self._wpos = write_pos
        self._dirty_start = -1
        self._ends.pop(segment.id, None)

    # ---- reading ---------------------------------------------------------------------------------

    def read(self, pos: int) -> StoredMessage:
        """The message at ``pos``; MissingRecord if it is not there, CorruptRecord if it is damaged."""
        # pos_segment / pos_offset inlined: once per delivery.
        segment_id = pos & SEGMENT_MASK
        offset = pos >> OFFSET_SHIFT
        segment = self._segments.get(segment_id)
        if segment is None:
            raise MissingRecord(f"message segment {segment_id} does not exist (position {offset})")
        end = self._wpos if segment_id == self._cur_id else self._ends[segment_id]
        if not DATA_START <= offset < end:
            raise MissingRecord(f"offset {offset} is outside the valid data of segment {segment_id} ({end})")
        if offset - segment.read_released > _READ_BEHIND:
            segment.read_through(offset)
        view = segment.view
        try:
            if offset + 4 <= end and (view[offset + 2] & 0xFC or view[offset + 3]):
                return read_in_place(view, offset, segment.size)
            return read_record(view, offset, segment.size)[0]
        except CorruptRecord as exc:
            raise CorruptRecord(f"{segment.path.name}: {exc}") from None

    def read_many(self, positions: list[int]) -> list[StoredMessage]:
        """``read`` for a run of positions (compiled: record.read_run a segment's stretch); raises as ``read``."""
        if read_run is None:
            return self._read_each(positions)
        messages: list[StoredMessage] = []
        i, count = 0, len(positions)
        while i < count:
            pos = positions[i]
            segment_id = pos & SEGMENT_MASK
            segment = self._segments.get(segment_id)
            if segment is not None:
                end = self._wpos if segment_id == self._cur_id else self._ends.get(segment_id, 0)
                run = read_run(segment.view, positions, i, segment_id, DATA_START, end, segment.size)
                if run:
                    messages += run
                    i += len(run)
                    if (last := positions[i - 1] >> OFFSET_SHIFT) - segment.read_released > _READ_BEHIND:
                        segment.read_through(last)
                    continue
            messages.append(self.read(pos))  # a large record in place; or raises: missing or damaged
            i += 1
        return messages

    def readable(self, segment_id: int) -> tuple[Segment, int] | None:
        """An open segment and where its valid records end (``read_many``'s lookups, for a caller's own read)."""
        segment = self._segments.get(segment_id)
        end = self._wpos if segment_id == self._cur_id else self._ends.get(segment_id, 0)
        return None if segment is None else (segment, end)

    def _read_each(self, positions: list[int]) -> list[StoredMessage]:
        messages: list[StoredMessage] = []
        add = messages.append
        segment_id = -1
        view = memoryview(b"")
        size = end = 0
        for pos in positions:
            if pos & SEGMENT_MASK != segment_id or not DATA_START <= pos >> OFFSET_SHIFT < end:
                # another segment, or an offset to check: read() says what is wrong, if anything
                add(self.read(pos))  # which also drops the segment's pages behind the reads
                segment_id = pos & SEGMENT_MASK
                segment = self._segments[segment_id]
                view, size = segment.view, segment.size
                end = self._wpos if segment_id == self._cur_id else self._ends[segment_id]
                continue
            offset = pos >> OFFSET_SHIFT
            try:
                if view[offset + 2] & 0xFC or view[offset + 3]:  # a large record (see read_in_place)
                    add(read_in_place(view, offset, size))
                else:
                    add(read_record(view, offset, size)[0])
            except (CorruptRecord, IndexError):
                add(self.read(pos))  # raises with the segment's name
        return messages

    def salvage(self, pos: int) -> StoredMessage | None:
        """A damaged record's fields without the CRC check, if its layout still adds up; else None."""
        segment = self._segments.get(pos_segment(pos))
        if segment is None:
            return None
        try:
            return read_record(segment.view, pos_offset(pos), segment.size, verify=False)[0]
        except (CorruptRecord, ValueError, IndexError):
            return None

    def is_valid(self, pos: int) -> bool:
        """Whether ``pos`` points into the valid data of an existing segment."""
        segment_id = pos_segment(pos)
        offset = pos_offset(pos)
        if segment_id == self._cur_id:
            return DATA_START <= offset < self._wpos
        end = self._ends.get(segment_id)
        return end is not None and DATA_START <= offset < end

    def valid_ends(self) -> dict[int, int]:
        """Segment id -> end of its valid data, for validating many positions in one loop."""
        ends = dict(self._ends)
        ends[self._cur_id] = self._wpos
        return ends

    # ---- references and deletion -----------------------------------------------------------------

    def incref(self, segment_id: int, n: int = 1) -> None:
        self._refs[segment_id] = self._refs.get(segment_id, 0) + n

    def decref(self, segment_id: int, n: int = 1) -> None:
        count = self._refs.get(segment_id, 0) - n
        if count > 0:
            self._refs[segment_id] = count
            return
        if count < 0:
            log.error("%s: reference count of segment %d went below zero (%d)", self.path, segment_id, count)
        self._refs.pop(segment_id, None)
        self._maybe_delete(segment_id)

    def refcount(self, segment_id: int) -> int:
        return self._refs.get(segment_id, 0)

    @property
    def recovering(self) -> bool:
        """True until delete_unreferenced(): no segment is deleted while queues are still loading."""
        return self._recovering

    def delete_unreferenced(self) -> int:
        """End the recovery phase: delete every non-current segment no queue references.

        Returns how many segments were deleted (or queued for deletion while deletions are held).
        """
        self._recovering = False
        self._resolve_tail()
        unreferenced = [i for i in self._segments if i != self._cur_id and not self._refs.get(i)]
        for segment_id in unreferenced:
            self._maybe_delete(segment_id)
        return len(unreferenced)

    def note_references(self, entries: Iterable[int]) -> None:
        """Recovery: an index loaded these positions (checked only while a tail is unresolved)."""
        if self._tail is None or self._tail_referenced:
            return
        current, start = self._cur_id, self._tail[0]
        self._tail_referenced = any(pos_segment(p) == current and pos_offset(p) >= start for p in entries)

    def _resolve_tail(self) -> None:
        if self._tail is None:
            return
        (start, end), self._tail = self._tail, None
        name = segment_name(self._cur_id)
        if self._tail_referenced:
            # An index points at these bytes: a damaged record, reported when read; appends go after it.
            log.error("%s/%s: bytes %d to %d hold no valid record but are referenced by a queue index; "
                      "kept (the damaged message is skipped when read)", self.path, name, start, end)
            return
        assert self._cur is not None
        self._cur.zero(start, end)
        self._wpos = start
        log.warning("%s/%s: discarded %d bytes of a torn write at offset %d", self.path, name, end - start, start)

    def _maybe_delete(self, segment_id: int) -> None:
        if self._recovering or segment_id == self._cur_id or segment_id not in self._segments:
            return
        if self._held:
            self._pending_deletes.add(segment_id)
        else:
            self._delete(segment_id)

    def _delete(self, segment_id: int) -> None:
        segment = self._segments.pop(segment_id)
        self._ends.pop(segment_id, None)
        if self._dirty:
            self._dirty = [r for r in self._dirty if r[0] is not segment]
        self._files.remove(segment)  # unmapped and unlinked in a worker thread
        log.debug("%s: deleted unreferenced segment %s", self.path, segment.path.name)

    def hold_deletions(self) -> None:
        """Postpone deletions (a worker thread may be syncing segments). Nests."""
        self._held += 1

    def release_deletions(self) -> None:
        """End one hold; at the last one, delete what became deletable meanwhile."""
        if self._held <= 0:
            raise RuntimeError("release_deletions() without hold_deletions()")
        self._held -= 1
        if self._held:
            return
        pending, self._pending_deletes = self._pending_deletes, set()
        for segment_id in sorted(pending):
            if segment_id in self._segments and segment_id != self._cur_id and not self._refs.get(segment_id):
                self._delete(segment_id)

    def settle_removals(self) -> None:
        """Wait until the segments deleted so far are gone from the disk (they go in a worker thread)."""
        self._files.settle()

    @contextmanager
    def deletions_held(self) -> Iterator[None]:
        self.hold_deletions()
        try:
            yield
        finally:
            self.release_deletions()

    # ---- durability ------------------------------------------------------------------------------

    def take_dirty(self) -> list[DirtyRange]:
        """The (segment, start, end) ranges written since the last call; clears them (loop thread)."""
        ranges = self._dirty
        self._dirty = []
        if self._dirty_start >= 0 and self._cur is not None:
            ranges.append((self._cur, self._dirty_start, self._wpos))
            self._dirty_start = -1
        return ranges

    @staticmethod
    def sync_ranges(ranges: Iterable[DirtyRange]) -> None:
        """Sync the ranges from take_dirty(), each segment once (a sync covers the whole file).
        Runs in a worker thread."""
        fds = open_ranges(ranges)
        try:
            for fd in fds:
                os.fdatasync(fd)
        finally:
            for fd in fds:
                os.close(fd)

    # ---- introspection ---------------------------------------------------------------------------

    def release_memory(self) -> int:
        """Drop the pages of sealed segments from this process's mapping; returns segments released.

        Pages we wrote or read stay mapped and count as the broker's RSS, so a queue of 10M messages
        would cost the size of its segments in RSS. For a shared file mapping MADV_DONTNEED only
        unmaps them: the data stays in the page cache and the file (dirty pages are still written
        back and a sync of the file still covers them), and a later read maps them in again.
        """
        advice = getattr(mmap, "MADV_DONTNEED", None)
        if advice is None:
            return 0
        released = 0
        for segment_id, segment in self._segments.items():
            if segment_id != self._cur_id and not segment.closed:
                segment.mm.madvise(advice)
                released += 1
        return released

    @property
    def current_segment_id(self) -> int:
        return self._cur_id

    def segment_ids(self) -> list[int]:
        return sorted(self._segments)

    def disk_bytes(self) -> int:
        """Bytes the segment files take (they are allocated at full size)."""
        return sum(segment.size for segment in self._segments.values())
