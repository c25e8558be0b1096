"""One memory-mapped message segment file, ``msgs.NNNNNNNNNN``.

A segment is created at its full size and starts with a 4-byte schema version; records follow
back to back from offset 4 (see record.py). Unwritten space is zeros, so after a crash a zero
length ends the valid data.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import re
import struct
import zlib
from collections.abc import Iterable
from pathlib import Path

from lavinpy.store import changes
from lavinpy.store.jsonfile import fsync_dir
from lavinpy.store.record import FIXED_PAYLOAD, HEADER, HEADER_SIZE, record_checks_out, record_layout_ok

log = logging.getLogger("lavinpy.store")

SCHEMA_VERSION = 1
DATA_START = 4  # records start after the u32 schema version
_VERSION = struct.Struct("<I")
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_TAIL_CHUNK = 64 * 1024  # data_end() looks at the file end in chunks of this size
_NONZERO = re.compile(rb"[^\x00]")


class SegmentError(Exception):
    """A segment file cannot be used (too short, wrong schema version)."""


def segment_name(segment_id: int) -> str:
    return f"msgs.{segment_id:010d}"


# A consumer behind the writer faults in the pages it reads, of a sealed segment or of the current one
# behind the pages the writer already let go (message_store._KEEP_MAPPED), and they stayed mapped until
# the vhost's next release_memory (2 s, sealed segments only): in scenario b up to a whole segment, 8 MiB
# of the RSS peak. Pages this far behind the furthest read so far leave the mapping as the reads go on
# (they stay in the page cache: a queue reading further back maps them in again).
READ_KEEP_MAPPED = 256 * 1024
_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)


class Segment:
    """A mapped segment file. ``mm`` is the writable mmap, ``view`` a memoryview of it for reads."""

    __slots__ = ("id", "path", "size", "mm", "view", "closed", "name_unsynced", "_fd", "read_released")

    def __init__(self, segment_id: int, path: Path, mm: mmap.mmap) -> None:
        self.id = segment_id
        self.path = path
        self.size = len(mm)
        self.mm = mm
        self.view = memoryview(mm)
        self.closed = False
        self.name_unsynced = False  # renamed into place; the directory not synced since (see sync)
        self.read_released = 0  # pages before this offset left the mapping behind reads (see read_through)
        self._fd = -1  # opened by fileno() on first use

    def fileno(self) -> int:
        """A read-write descriptor of the file, opened on first use and closed with the segment: a large
        body's pieces are written through it (``pwrite``: into the page cache without faulting the
        pages into this mapping; the mapping sees them, as both are the same page cache)."""
        fd = self._fd
        if fd < 0:
            fd = self._fd = os.open(self.path, os.O_RDWR | _CLOEXEC)
        return fd

    @classmethod
    def create(cls, directory: Path, segment_id: int, size: int) -> Segment:
        """Create the file at full size, write the schema version, map it and make the name durable."""
        segment = cls.create_unnamed(directory / segment_name(segment_id), segment_id, size)
        fsync_dir(directory)
        segment.announce()
        return segment

    @classmethod
    def create_unnamed(cls, path: Path, segment_id: int, size: int) -> Segment:
        """``create`` under a name the store does not read (``segment_files``: made ahead in a worker
        thread); ``adopt`` names it. Nothing is announced to the change feed yet."""
        if size < DATA_START + HEADER_SIZE:
            raise ValueError(f"segment size {size} is too small")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            # Reserve the blocks now: writing through a mapping of a sparse file on a full disk is a
            # SIGBUS that kills the broker; here it is an OSError the caller can handle.
            if hasattr(os, "posix_fallocate"):
                try:
                    os.posix_fallocate(fd, 0, size)
                except OSError as exc:
                    if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # filesystem cannot reserve
                        raise
            os.pwrite(fd, _VERSION.pack(SCHEMA_VERSION), 0)
            os.fsync(fd)
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            try:
                path.unlink()
            except OSError:
                pass
            raise
        os.close(fd)  # the mmap object keeps its own descriptor
        return cls(segment_id, path, mm)

    def adopt(self, path: Path) -> None:
        """Give a segment made by ``create_unnamed`` its name (before anything is written into it); the
        directory entry is synced with its first synced range (``name_unsynced``)."""
        os.rename(self.path, path)
        self.path = path
        self.name_unsynced = True
        self.announce()

    def announce(self) -> None:
        """Tell the change feed (the cluster's followers) the new file: its size and header."""
        if changes.feed.listener is not None:
            changes.truncated(self.path, self.size)
            changes.appended(self.path, 0, _VERSION.pack(SCHEMA_VERSION))

    @classmethod
    def open(cls, directory: Path, segment_id: int) -> Segment:
        """Map an existing segment; raises SegmentError if it is too short or of another schema."""
        path = directory / segment_name(segment_id)
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if size < DATA_START:
                raise SegmentError(f"{path.name} is {size} bytes long, shorter than its header")
            version = _VERSION.unpack(os.pread(fd, DATA_START, 0))[0]
            if version != SCHEMA_VERSION:
                raise SegmentError(f"{path.name} has schema version {version}, expected {SCHEMA_VERSION}")
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return cls(segment_id, path, mm)

    def data_end(self) -> int:
        """Position just after the last non-zero byte (at least DATA_START).

        The cheap valid end of a sealed segment: every record starts before it (a record's length
        field is non-zero), though the last record may end in zero bytes after it. It scans zeros
        backwards from the end in C-speed chunks and never walks records.
        """
        mm = self.mm
        end = self.size
        while end > DATA_START:
            start = max(DATA_START, end - _TAIL_CHUNK)
            kept = len(mm[start:end].rstrip(b"\0"))
            if kept:
                return start + kept
            end = start
        return DATA_START

    def scan(self) -> tuple[int, int]:
        """Walk the records from the start: (end of the last valid record, end of the non-zero data).

        A record whose layout checks out but whose CRC does not (a reserved record whose body never
        completed, or a torn write) is stepped over by its length. A record whose length or layout is
        wrong is skipped by searching forward for the next record whose header and CRC check out; the
        damaged bytes stay in place (an index may point at them; the reader reports them). When no
        valid record follows, the bytes from the end of the last valid record to the second value are
        a tail the caller resolves: a torn write to zero, unless an index references it. Nothing is
        written here.
        """
        view = self.view
        size = self.size
        crc32 = zlib.crc32
        unpack = HEADER.unpack_from
        data_end = self.data_end()
        pos = valid_end = DATA_START
        while pos < data_end:
            if pos + HEADER_SIZE <= size:
                length, crc = unpack(view, pos)
                end = pos + HEADER_SIZE + length
                if length and end <= size:
                    if crc32(view[pos + HEADER_SIZE:end]) == crc:
                        pos = valid_end = end
                        continue
                    if record_layout_ok(view, pos, size):
                        # whole in layout, not in content: a reserved record whose body never completed
                        # (see reserved_record.py), or a torn write; stepped over by its length (a tail
                        # when nothing valid follows it)
                        log.warning("%s: the record at offset %d (%d bytes) is incomplete; skipped",
                                    self.path.name, pos, end - pos)
                        pos = end
                        continue
            found = self._next_record(pos + 1, data_end)
            if found < 0:
                break
            log.error("%s: bytes %d to %d hold no valid record (damaged); skipped, the records after "
                      "them are kept", self.path.name, pos, found)
            pos = valid_end = found
        return valid_end, max(data_end, valid_end)

    def _next_record(self, pos: int, limit: int) -> int:
        """Offset of the first record starting in [pos, limit) whose layout and CRC check out, or -1.

        Runs only on damage. Zero runs are skipped at C speed; a record's first non-zero byte is at
        most 3 bytes into its length field, so the search backs up that far.
        """
        view = self.view
        size = self.size
        search = _NONZERO.search
        while pos < limit and pos + HEADER_SIZE <= size:
            length = view[pos] | view[pos + 1] << 8 | view[pos + 2] << 16 | view[pos + 3] << 24
            if length == 0:
                match = search(self.mm, pos, limit)
                if match is None:
                    return -1
                pos = max(pos + 1, match.start() - 3)
                continue
            if FIXED_PAYLOAD <= length <= size - pos - HEADER_SIZE and record_checks_out(view, pos, size):
                return pos
            pos += 1
        return -1

    def scan_write_position(self) -> int:
        """``scan()`` for a segment no index points into: any tail is a torn write, zeroed here."""
        valid_end, data_end = self.scan()
        if data_end > valid_end:
            self.zero(valid_end, data_end)
            log.warning("%s: discarded %d bytes of a torn write at offset %d", self.path.name,
                        data_end - valid_end, valid_end)
        return valid_end

    def zero(self, start: int, end: int) -> None:
        """Zero [start, end) and sync it: a torn write, so that later scans and appends see a clean tail."""
        if end > start:
            self.mm[start:end] = bytes(end - start)
            self.sync(start, end)
            changes.appended(self.path, start, bytes(end - start))

    def sync(self, start: int, end: int) -> None:
        """Put the written pages covering [start, end) on disk. Safe to call from a worker thread.

        The pages of a shared mapping are the file's page cache, so syncing the file covers them.
        Not ``mmap.flush()``: its msync holds the GIL, which stopped the event loop for the whole
        sync; ``os.fdatasync`` releases it. Other dirty pages of the file go along (a later append
        reaching the disk early is harmless), and the timestamps are left to the journal's own pace.
        """
        fd = self.open_for_sync(start, end)
        if fd < 0:
            return
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def open_for_sync(self, start: int, end: int) -> int:
        """``sync`` up to the sync itself: the new name made durable, and a descriptor of the file to
        sync and close (-1: nothing to sync, or the file is gone with the closed segment)."""
        if end <= start or self.closed:
            return -1
        if self.name_unsynced:
            fsync_dir(self.path.parent)
            self.name_unsynced = False
        try:
            return os.open(self.path, os.O_RDONLY | _CLOEXEC)
        except FileNotFoundError:  # deleted meanwhile; the caller held deletions, so only on shutdown
            if not self.closed:
                raise
            return -1

    def read_through(self, offset: int) -> None:
        """A read of this segment reached ``offset``: drop the pages READ_KEEP_MAPPED and more
        behind it from the mapping, once that is READ_KEEP_MAPPED more than before (the caller checks
        ``offset - read_released > 2 * READ_KEEP_MAPPED`` first, so that most reads cost no call)."""
        upto = (offset - READ_KEEP_MAPPED) & ~(mmap.PAGESIZE - 1)
        if _DONTNEED is None or self.closed or upto <= self.read_released:
            return
        self.mm.madvise(_DONTNEED, self.read_released, upto - self.read_released)
        self.read_released = upto

    def close(self) -> None:
        """Unmap and close the file. Unmapping comes first so that a later unlink frees the space."""
        if self.closed:
            return
        self.closed = True
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.view.release()
        try:
            self.mm.close()
        except BufferError:
            # A large body is being delivered from a slice of the mapping (record.read_in_place):
            # the mapping goes when the last slice does; the file's name may go now (its space is
            # freed once it is unmapped).
            pass

    def delete(self) -> None:
        """Close, then remove the file."""
        self.close()
        self.path.unlink(missing_ok=True)
        changes.deleted(self.path)

    def __repr__(self) -> str:
        return f"Segment({self.path.name}, size={self.size})"


def open_ranges(ranges: Iterable[tuple[Segment, int, int]]) -> list[int]:
    """A descriptor to sync and close for each segment of the (segment, start, end) ranges, the new
    names made durable first (``Segment.open_for_sync``). Worker thread."""
    fds: list[int] = []
    seen: set[Segment] = set()
    try:
        for segment, start, end in ranges:
            if end > start and segment not in seen:
                seen.add(segment)
                fd = segment.open_for_sync(start, end)
                if fd >= 0:
                    fds.append(fd)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds
