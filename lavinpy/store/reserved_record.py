"""A message record whose body arrives in pieces (the frames of a large AMQP body), written straight
into its reserved place in a segment: one copy of each piece, from the frame into the file (pwrite), and
no copy of the whole body in the heap or a spool file.

Layout and lifetime: ``MessageStore.reserve`` writes the record's header with its length but a CRC
of zero, its names, properties and body size, and moves the write position past the whole record, so
other messages are appended after it meanwhile. The body pieces are copied in as they come, the CRC
running over them. ``seal`` writes the CRC (the record is then whole and valid) and returns its
position for the queues; a body that does not complete (a connection or channel gone mid-body) leaves
it as it is (``release`` without ``seal``): an incomplete record of known length that no index
references, which a recovery scan skips by its length (or zeroes as a torn tail when it is the last).
The reservation holds a reference to its segment until ``release``, so the segment is not deleted
under it when another append seals it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from lavinpy.store.jsonfile import pwrite_all
from lavinpy.store.record import HEADER
from lavinpy.wire.position import OFFSET_SHIFT

if TYPE_CHECKING:
    from collections.abc import Callable

    from lavinpy.store.segment import Segment

# The body's pieces go into the file with pwrite, not through the mapping: the kernel copies them into
# the page cache, and none of the body's pages is faulted into (zero-filled, mapped and later dropped
# from) this process's mapping, so the body never sits in the broker's RSS and the loop does no page
# table work for it. The mapping sees the same page cache, so a read in place finds the bytes.


class MessageStore(Protocol):
    """What a reservation tells its store (message_store.MessageStore)."""

    def reserved_written(self, record: ReservedRecord) -> None: ...
    def decref(self, segment_id: int, n: int = 1) -> None: ...


class ReservedRecord:
    """One record's place in a segment, its body written piece by piece (see the module docstring)."""

    __slots__ = ("segment", "offset", "body_start", "end", "written", "crc", "position", "_crc32", "_store")

    def __init__(self, store: MessageStore, segment: Segment, offset: int, body_start: int, end: int,
                 head_crc: int, crc32: Callable[[bytes | memoryview, int], int]) -> None:
        self.segment = segment
        self.offset = offset  # the record's header
        self.body_start = body_start
        self.end = end
        self.written = 0
        self.crc = head_crc  # running CRC of the payload written so far
        self.position = segment.id | (offset << OFFSET_SHIFT)
        self._crc32 = crc32
        self._store: MessageStore | None = store  # None once released

    @property
    def body_size(self) -> int:
        return self.end - self.body_start

    @property
    def complete_body(self) -> bool:
        return self.written == self.end - self.body_start

    def write(self, data: bytes | memoryview) -> None:
        """The next piece of the body (the caller has checked it does not run past the body)."""
        start = self.body_start + self.written
        pwrite_all(self.segment.fileno(), (data,), start)
        self.crc = self._crc32(data, self.crc)
        self.written += len(data)

    def body(self) -> memoryview:
        """The body as a slice of the segment's mapping (valid while the reservation is held)."""
        return self.segment.view[self.body_start:self.end]

    def seal(self) -> int:
        """Write the CRC (the record is whole; the body must be complete) and mark it for the next
        sync; returns its position, for the queues."""
        if not self.complete_body:
            raise ValueError(f"record body has {self.written} of {self.body_size} bytes")
        HEADER.pack_into(self.segment.mm, self.offset, self.end - self.offset - HEADER.size, self.crc)
        assert self._store is not None
        self._store.reserved_written(self)
        return self.position

    def release(self) -> None:
        """Give up the reservation's reference to its segment (once; later calls do nothing): after
        the queues took the sealed record's position, or with the record left incomplete when the
        body will not complete (unreferenced, it goes with its segment)."""
        store, self._store = self._store, None
        if store is not None:
            store.decref(self.segment.id)
