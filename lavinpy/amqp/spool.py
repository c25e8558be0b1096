"""A connection's body spool: large message bodies written to an unlinked file in the data dir as
their frames arrive, read back (or mapped read-only) when the message is complete.

This is the file I/O the sans-IO channel does not do itself: the connection's driver provides a
spool (``BodySpool``) and the channel only reserves, writes and releases regions of it.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from pathlib import Path

# Bodies larger than this that do not arrive in one frame are spooled to disk as they arrive.
SPOOL_MIN_BODY = 32 * 1024
# A spool file takes new bodies until it is this big; then the next one starts a new file.
SPOOL_FILE_MAX = 16 * 1024 * 1024


class SpoolFile:
    __slots__ = ("fd", "end", "users")

    def __init__(self, directory: Path) -> None:
        fd, path = tempfile.mkstemp(prefix=".spool-", dir=directory)
        os.unlink(path)  # freed by the kernel once closed and unmapped, even after a crash
        self.fd = fd
        self.end = 0
        self.users = 0


class SpooledBody:
    """One body's region of a spool file."""

    __slots__ = ("spool", "file", "offset", "size", "written")

    def __init__(self, spool: BodySpool, file: SpoolFile, offset: int, size: int) -> None:
        self.spool = spool
        self.file = file
        self.offset = offset
        self.size = size
        self.written = 0

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            n = os.pwrite(self.file.fd, view, self.offset + self.written)
            self.written += n
            view = view[n:]

    def read(self) -> bytes | memoryview:
        """The body: small ones as bytes, large ones as a read-only mapping of the file (page cache,
        not heap); the mapping outlives the file's descriptor and goes when the last view does."""
        if self.size < SPOOL_MIN_BODY:
            return os.pread(self.file.fd, self.size, self.offset) if self.size else b""
        start = self.offset - self.offset % mmap.ALLOCATIONGRANULARITY
        mapped = mmap.mmap(self.file.fd, self.offset + self.size - start, access=mmap.ACCESS_READ,
                           offset=start)
        return memoryview(mapped)[self.offset - start:]

    def release(self) -> None:
        """Give the region up (once; later calls do nothing)."""
        file = self.file
        if file is None:
            return
        self.file = None  # type: ignore[assignment]
        file.users -= 1
        if not file.users and file is not self.spool.current:
            os.close(file.fd)


class BodySpool:
    """A connection's spool files. Regions are never reused (a mapping may still be in use);
    a full file is closed once no body in it is pending, and the kernel frees it."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.current: SpoolFile | None = None

    def reserve(self, size: int) -> SpooledBody:
        file = self.current
        if file is None or file.end >= SPOOL_FILE_MAX:
            if file is not None and not file.users:
                os.close(file.fd)
            file = self.current = SpoolFile(self.directory)
        offset = file.end
        file.end += size
        file.users += 1
        return SpooledBody(self, file, offset, size)

    def close(self) -> None:
        file, self.current = self.current, None
        if file is not None and not file.users:
            os.close(file.fd)
