"""Content assembly for a channel: header and body frames into one message.

A body that arrives in one frame is published from that frame (the fast path). A larger body that
arrives in several frames is written to the connection's spool (an unlinked file in the data dir)
frame by frame, so a slow or large message costs disk, not heap; at completion it is mapped
read-only and published from the mapping. Uncommitted transactional publishes are spooled the same
way and read back at tx.commit.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ..wire.constants import FRAME_ERROR, PRECONDITION_FAILED, RESOURCE_ERROR, UNEXPECTED_FRAME
from ..wire.errors import AMQPChannelError, AMQPConnectionError
from ..wire.reader import HeaderFrame

if TYPE_CHECKING:
    from .connection import AMQPConnection

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


class PendingPublish(NamedTuple):
    """A publish inside a transaction, its body on disk until tx.commit."""

    exchange: str
    routing_key: str
    mandatory: bool
    properties: bytes
    body: SpooledBody


class ContentAssembly:
    """Mixin for Channel: content header and body frames."""

    id: int
    conn: AMQPConnection
    in_content: bool
    _header_seen: bool
    _publish: Any
    _properties: bytes
    _body_size: int
    _body_parts: list[bytes]
    _body_received: int
    _spooled: SpooledBody | None
    _tx_publishes: list[PendingPublish]

    def _reset_content(self) -> None:
        self.in_content = False
        self._header_seen = False
        self._publish = None
        self._body_parts = []
        self._body_received = 0
        if self._spooled is not None:
            self._spooled.release()
            self._spooled = None

    def on_header(self, frame: HeaderFrame) -> None:
        if self._header_seen:
            raise AMQPConnectionError(UNEXPECTED_FRAME, f"unexpected content header on channel {self.id}")
        if frame.class_id != 60:
            raise AMQPConnectionError(FRAME_ERROR, f"content header for class {frame.class_id}, "
                                                   "expected class 60 (basic)")
        body_size = frame.body_size
        if body_size > self.conn.config.max_message_size:
            self._reset_content()
            self.close_with_error(AMQPChannelError(
                PRECONDITION_FAILED, f"message size {body_size} is larger than configured max size "
                                     f"{self.conn.config.max_message_size}", 60, 40), None)
            return
        self._header_seen = True
        self._properties = frame.properties
        self._body_size = body_size
        if body_size == 0:
            self._complete_publish(b"")

    def on_body(self, data: bytes) -> None:
        if not self._header_seen:
            raise AMQPConnectionError(UNEXPECTED_FRAME, f"expected content header on channel {self.id}, "
                                                        "got a content body frame")
        received = self._body_received + len(data)
        if received > self._body_size:
            raise AMQPConnectionError(
                FRAME_ERROR, f"content body on channel {self.id} is longer than the "
                             f"{self._body_size} bytes announced in its header")
        spooled = self._spooled
        if spooled is None and received == self._body_size:
            if self._body_parts:
                self._body_parts.append(data)
                data = b"".join(self._body_parts)
            self._complete_publish(data)
            return
        self._body_received = received
        if spooled is None and self._body_size <= SPOOL_MIN_BODY:
            self._body_parts.append(data)
            return
        try:
            if spooled is None:
                spooled = self._spooled = self.conn.body_spool().reserve(self._body_size)
                for part in self._body_parts:
                    spooled.write(part)
                self._body_parts = []
            spooled.write(data)
            if received < self._body_size:
                return
            body = spooled.read()
        except OSError as e:
            self._reset_content()
            self.close_with_error(AMQPChannelError(RESOURCE_ERROR, f"cannot store the message body: {e}",
                                                   60, 40), None)
            return
        self._spooled = None  # _complete_publish resets the content: the body stays with us
        try:
            self._complete_publish(body)
        finally:
            spooled.release()

    def _tx_publish(self, method: Any, properties: bytes, body: bytes | memoryview) -> None:
        """Hold a transactional publish until tx.commit, its body on disk."""
        spooled = self.conn.body_spool().reserve(len(body))
        try:
            spooled.write(body)
        except OSError as e:
            spooled.release()
            raise AMQPChannelError(RESOURCE_ERROR, f"cannot store the message body: {e}", 60, 40)
        self._tx_publishes.append(
            PendingPublish(method.exchange, method.routing_key, method.mandatory, properties, spooled))

    def _complete_publish(self, body: bytes | memoryview) -> None:
        raise NotImplementedError

    def close_with_error(self, error: AMQPChannelError, method: Any | None) -> None:
        raise NotImplementedError


def release_bodies(publishes: list[PendingPublish]) -> None:
    for publish in publishes:
        publish.body.release()
