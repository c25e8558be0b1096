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
import struct
import zlib
from pathlib import Path

from lavinpy.store.record import HEADER, HEADER_SIZE

log = logging.getLogger("lavinpy.store")

SCHEMA_VERSION = 1
DATA_START = 4  # records start after the u32 schema version
_VERSION = struct.Struct("<I")
_PAGE = mmap.ALLOCATIONGRANULARITY
_TAIL_CHUNK = 64 * 1024  # data_end() looks at the file end in chunks of this size


class SegmentError(Exception):
    """A segment file cannot be used (too short, wrong schema version)."""


def segment_name(segment_id: int) -> str:
    return f"msgs.{segment_id:010d}"


def fsync_directory(directory: Path) -> None:
    """Make a created, renamed or deleted name in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Segment:
    """A mapped segment file. ``mm`` is the writable mmap, ``view`` a memoryview of it for reads."""

    __slots__ = ("id", "path", "size", "mm", "view", "closed")

    def __init__(self, segment_id: int, path: Path, mm: mmap.mmap) -> None:
        self.id = segment_id
        self.path = path
        self.size = len(mm)
        self.mm = mm
        self.view = memoryview(mm)
        self.closed = False

    @classmethod
    def create(cls, directory: Path, segment_id: int, size: int) -> Segment:
        """Create the file at full size, write the schema version, map it and make the name durable."""
        if size < DATA_START + HEADER_SIZE:
            raise ValueError(f"segment size {size} is too small")
        path = directory / segment_name(segment_id)
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
        fsync_directory(directory)
        return cls(segment_id, path, mm)

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

    def scan_write_position(self) -> int:
        """Walk the records from the start and return where the valid data ends.

        Stops at a zero length. A last record that runs past the file or fails its CRC is a torn
        write: it and any bytes after it are zeroed, so later scans and appends see a clean tail.
        A bad record followed by a good one is not a tail: it is left in place for the reader to
        report (the queues holding it get CorruptRecord).
        """
        view = self.view
        size = self.size
        crc32 = zlib.crc32
        unpack = HEADER.unpack_from
        pos = DATA_START
        while pos + HEADER_SIZE <= size:
            length, crc = unpack(view, pos)
            if length == 0:
                break
            end = pos + HEADER_SIZE + length
            if end > size:
                break
            if crc32(view[pos + HEADER_SIZE:end]) != crc:
                if self._valid_record_at(end):
                    log.error("%s: record at offset %d fails its CRC check; keeping the records after it",
                              self.path.name, pos)
                    pos = end
                    continue
                break
            pos = end
        self._zero_tail(pos)
        return pos

    def _valid_record_at(self, pos: int) -> bool:
        if pos + HEADER_SIZE > self.size:
            return False
        length, crc = HEADER.unpack_from(self.view, pos)
        end = pos + HEADER_SIZE + length
        return length != 0 and end <= self.size and zlib.crc32(self.view[pos + HEADER_SIZE:end]) == crc

    def _zero_tail(self, pos: int) -> None:
        end = self.data_end()
        if end > pos:
            self.mm[pos:end] = bytes(end - pos)
            self.sync(pos, end)
            log.warning("%s: discarded %d bytes of a torn write at offset %d", self.path.name, end - pos, pos)

    def sync(self, start: int, end: int) -> None:
        """msync the pages covering [start, end). Safe to call from a worker thread."""
        if end <= start or self.closed:
            return
        aligned = start - start % _PAGE
        try:
            self.mm.flush(aligned, min(end, self.size) - aligned)
        except ValueError:  # closed meanwhile; the caller held deletions, so only on shutdown
            if not self.closed:
                raise

    def close(self) -> None:
        """Unmap and close the file. Unmapping comes first so that a later unlink frees the space."""
        if self.closed:
            return
        self.closed = True
        self.view.release()
        self.mm.close()

    def delete(self) -> None:
        """Close, then remove the file."""
        self.close()
        self.path.unlink(missing_ok=True)

    def __repr__(self) -> str:
        return f"Segment({self.path.name}, size={self.size})"
