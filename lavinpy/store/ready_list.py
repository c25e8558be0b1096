"""A queue's never-delivered ready messages: a FIFO of 8-byte positions, no Python object per entry.

``ReadyList`` is the C one from _cstore when built (accel.py: fixed 32 KiB blocks off an array of
block pointers), else ``PyReadyList``: a deque of ``array('Q')`` chunks. In both, growing never copies
the entries already queued and each chunk is freed as soon as it is consumed, so a backlog costs 8
bytes a message and a drained list gives its memory back. Both have the same methods
and the same behaviour (tests/store/test_cstore_equivalence.py).
"""

from __future__ import annotations

from array import array
from collections import deque

from lavinpy.store.accel import cstore

CHUNK_ENTRIES = 4096  # entries per array chunk: 32 KiB


class PyReadyList:
    """push / extend at the tail, shift / peek at the head, to_bytes for the whole list in order."""

    __slots__ = ("_chunks", "_tail", "_head", "_count")

    def __init__(self) -> None:
        self._chunks: deque[array] = deque([array("Q")])
        self._tail = self._chunks[0]
        self._head = 0  # index of the next entry in self._chunks[0]
        self._count = 0

    def push(self, pos: int) -> None:
        tail = self._tail
        if len(tail) >= CHUNK_ENTRIES:
            tail = self._tail = array("Q")
            self._chunks.append(tail)
        tail.append(pos)
        self._count += 1

    def extend(self, positions: array) -> None:
        """Append an ``array('Q')`` of positions."""
        if not positions:
            return
        tail = self._tail
        room = CHUNK_ENTRIES - len(tail)
        if room > 0:
            tail.extend(positions[:room])
        for start in range(max(room, 0), len(positions), CHUNK_ENTRIES):
            tail = self._tail = positions[start:start + CHUNK_ENTRIES]
            self._chunks.append(tail)
        self._count += len(positions)

    def shift(self) -> int | None:
        if not self._count:
            return None
        chunks = self._chunks
        head = chunks[0]
        pos = head[self._head]
        self._head += 1
        if self._head >= len(head):
            if len(chunks) > 1:
                chunks.popleft()
            else:  # the tail chunk is used up: reuse it
                del head[:]
            self._head = 0
        self._count -= 1
        return pos

    def shift_many(self, count: int) -> list[int]:
        """Remove and return up to ``count`` positions from the head."""
        taken: list[int] = []
        chunks = self._chunks
        while count > 0 and self._count:
            head = chunks[0]
            start = self._head
            stop = min(len(head), start + count)
            taken.extend(head[start:stop])
            n = stop - start
            count -= n
            self._count -= n
            if stop >= len(head):
                if len(chunks) > 1:
                    chunks.popleft()
                else:
                    del head[:]
                self._head = 0
            else:
                self._head = stop
        return taken

    def peek(self) -> int | None:
        if not self._count:
            return None
        return self._chunks[0][self._head]

    def to_bytes(self, start: int = 0, stop: int | None = None) -> bytes:
        """The positions ``[start, stop)`` in order (clamped as a slice; no negative indexes), packed."""
        if start < 0 or (stop is not None and stop < 0):
            raise ValueError("to_bytes: negative index")
        stop = self._count if stop is None else min(stop, self._count)
        out = array("Q")
        skip = self._head + start  # entries to pass over from the first chunk's start
        want = stop - start
        for chunk in self._chunks:
            if want <= 0:
                break
            if skip >= len(chunk):
                skip -= len(chunk)
                continue
            piece = chunk[skip:skip + want]
            out.extend(piece)
            want -= len(piece)
            skip = 0
        return out.tobytes()

    def clear(self) -> None:
        self._chunks.clear()
        self._tail = array("Q")
        self._chunks.append(self._tail)
        self._head = 0
        self._count = 0

    def __len__(self) -> int:
        return self._count


ReadyList: type = cstore.ReadyList if cstore is not None else PyReadyList

__all__ = ["ReadyList", "PyReadyList", "CHUNK_ENTRIES"]
