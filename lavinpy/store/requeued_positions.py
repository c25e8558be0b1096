"""A queue's requeued messages: delivered once and back, to go out again ahead of never-delivered ones,
in enq order. A heap of enq-order keys (``enq_order_key``: the position's halves swapped).

A closing channel can hand a queue back a consumer's whole window at once (a Spark task's share of
a queue is 65,535 a consumer): ``push_many`` builds the heap once and ``pop_many`` takes a delivery
run's worth, where a heap push or pop through a Python call each made the broker stall for a second
on half a million.
"""

from __future__ import annotations

import heapq
import sys
from array import array

from lavinpy.store.index_files import positions_array
from lavinpy.wire.position import OFFSET_SHIFT, SEGMENT_MASK, enq_order_key, pos_from_order_key

# A few keys onto a big heap go in a push each (log n); more, by one rebuild of the whole (n).
_REBUILD_SHARE = 16


class RequeuedPositions:
    """push / push_many, peek / pop / pop_many (the first in enq order); positions (sorted) and keys."""

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[int] = []

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, pos: int) -> None:
        heapq.heappush(self._heap, enq_order_key(pos))

    def push_many(self, positions: list[int]) -> None:
        heap = self._heap
        keys = order_keys(positions)
        if not heap:  # a closing channel's deliveries come nearly in enq order: a sorted list is a heap
            keys.sort()
            self._heap = keys
        elif len(keys) * _REBUILD_SHARE < len(heap):
            for key in keys:
                heapq.heappush(heap, key)
        else:
            heap += keys
            heapq.heapify(heap)

    def peek(self) -> int | None:
        return pos_from_order_key(self._heap[0]) if self._heap else None

    def pop(self) -> int:
        return pos_from_order_key(heapq.heappop(self._heap))

    def pop_many(self, count: int) -> list[int]:
        """The first ``count`` (all, when fewer), in enq order."""
        heap = self._heap
        if count >= len(heap):
            keys = sorted(heap)
            heap.clear()
        else:
            pop = heapq.heappop
            keys = [pop(heap) for _ in range(count)]
        return [((key & SEGMENT_MASK) << OFFSET_SHIFT) | (key >> OFFSET_SHIFT) for key in keys]

    def clear(self) -> None:
        self._heap.clear()

    def positions(self) -> array:
        """Every one, in enq order."""
        return array("Q", (pos_from_order_key(key) for key in sorted(self._heap)))

    def keys(self) -> list[int]:
        """Their enq-order keys, in no order."""
        return self._heap

    def memory_bytes(self) -> int:
        return sys.getsizeof(self._heap)


def order_keys(positions: list[int]) -> list[int]:
    """``enq_order_key`` of each position: the two 32-bit halves of each packed entry swapped, an array
    operation over all (a key computed a position at a time made three big ints of each)."""
    if len(positions) < 64:
        return [((pos & SEGMENT_MASK) << OFFSET_SHIFT) | (pos >> OFFSET_SHIFT) for pos in positions]
    words = memoryview(positions_array(positions)).cast("B").cast("I")  # segment, offset, segment, ...
    offsets, segments = array("I"), array("I")
    offsets.frombytes(words[1::2].tobytes())
    segments.frombytes(words[0::2].tobytes())
    keys = array("I", bytes(len(words) * 4))
    keys[0::2], keys[1::2] = offsets, segments  # a key: the offset in its low half, the segment in its high
    return memoryview(keys).cast("B").cast("Q").tolist()
