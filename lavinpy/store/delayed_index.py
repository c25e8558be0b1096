"""The index of a delayed exchange's held messages: ready messages come out by due time.

A ``DelayedIndex`` is a ``QueueIndex`` (same ``enq``/``ack`` files, durability, compaction and flush)
whose ready list is a heap of ``due_ms << 64 | pos`` ints: one int per held message. The due time is
the broker's business: it hands it in with ``push`` and, for recovered messages, gives ``due_of``
(a record -> its due time) at construction. Order in ``enq`` does not matter: due times are
rebuilt from the records.
"""

from __future__ import annotations

import heapq
import os
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from lavinpy.store.message_store import MissingRecord
from lavinpy.store.queue_index import DEFAULT_ACK_FILE_MAX_BYTES, QueueIndex
from lavinpy.store.record import CorruptRecord, StoredMessage

if TYPE_CHECKING:
    from lavinpy.store.message_store import MessageStore

_POS_BITS = 64
_POS_MASK = (1 << _POS_BITS) - 1


class DelayedIndex(QueueIndex):
    """A QueueIndex whose ready messages come out by due time (``push(pos, persistent, due_ms)``)."""

    def __init__(self, name: str, messages: MessageStore, directory: Path | None,
                 ack_file_max_bytes: int = DEFAULT_ACK_FILE_MAX_BYTES, *,
                 due_of: Callable[[StoredMessage], int], close_fd: Callable[[int], None] = os.close) -> None:
        self.due_of = due_of
        self._heap: list[int] = []
        self._due_of_unacked: dict[int, int] = {}  # unacked position -> due time (unacked are few)
        super().__init__(name, messages, directory, ack_file_max_bytes, close_fd=close_fd)

    def load_ready(self, live: array) -> None:
        read = self.messages.read
        heap = self._heap
        for pos in live:
            try:
                due = self.due_of(read(pos))
            except (CorruptRecord, MissingRecord):
                due = 0  # due now: the exchange logs it and drops it
            heap.append((due << _POS_BITS) | pos)
        heapq.heapify(heap)
        self.record_loaded(len(heap))

    def push(self, pos: int, persistent: bool = True, due_ms: int = 0) -> None:
        heapq.heappush(self._heap, (due_ms << _POS_BITS) | pos)
        self.record_push(pos, persistent)

    def next_due(self) -> int | None:
        """Due time (ms since the epoch) of the earliest held message, or None."""
        return self._heap[0] >> _POS_BITS if self._heap else None

    def peek(self) -> int | None:
        return self._heap[0] & _POS_MASK if self._heap else None

    def shift(self) -> int | None:
        """Take the earliest message, due or not (callers check ``next_due`` first)."""
        if not self._heap:
            return None
        entry = heapq.heappop(self._heap)
        pos = entry & _POS_MASK
        self.record_shift(pos)
        self._due_of_unacked[pos] = entry >> _POS_BITS
        return pos

    def ack(self, pos: int) -> None:
        super().ack(pos)
        self._due_of_unacked.pop(pos, None)

    def requeue(self, pos: int) -> None:
        self.record_requeue(pos)
        heapq.heappush(self._heap, (self._due_of_unacked.pop(pos) << _POS_BITS) | pos)

    def purge(self) -> int:
        if self.ready_count == 0:
            return 0
        removed = self.ready_positions()
        self._heap.clear()
        return self.record_purge(removed)

    def __iter__(self) -> Iterator[int]:
        """Held positions by due time."""
        for entry in sorted(self._heap):
            yield entry & _POS_MASK

    def ready_positions(self) -> array:
        return array("Q", (entry & _POS_MASK for entry in self._heap))

    def live_positions(self) -> array:
        out = self.ready_positions()
        out.extend(self.unacked())
        return out

    def delete(self) -> None:
        super().delete()
        self._heap.clear()
        self._due_of_unacked.clear()
