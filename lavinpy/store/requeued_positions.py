"""A queue's requeued messages: delivered once and back, to go out again ahead of never-delivered ones,
in enq order. Their enq-order keys (``enq_order_key``: the position's halves swapped), as a heap.

A closing channel can hand a queue back a consumer's whole window at once (a Spark task's share of
a queue is 65,535 a consumer): ``push_many`` takes them in one pass and ``pop_many`` a delivery run's
worth, where a heap push or pop through a Python call each made the broker stall for a second on half
a million. A window handed back onto none is kept sorted (a sorted list is a heap) and taken by slices
from its front, as are further windows merged into it (a dropped connection's channels each hand
theirs back), until a few pushed onto it make it a heap again.
"""

from __future__ import annotations

import heapq
import sys
from array import array

from lavinpy.store.index_files import positions_array
from lavinpy.wire.position import OFFSET_SHIFT, SEGMENT_MASK, enq_order_key, pos_from_order_key

# A few keys onto a big heap go in a push each (log n); more, by one rebuild of the whole (n).
_REBUILD_SHARE = 16
# Taken keys at the front of a sorted list are dropped once they are this many and half of it.
_DROP_TAKEN = 4096


class RequeuedPositions:
    """push / push_many, peek / pop / pop_many (the first in enq order); positions (sorted) and keys."""

    __slots__ = ("_keys", "_start", "_sorted")

    def __init__(self) -> None:
        self._keys: list[int] = []  # from _start on: a heap, or in order (_sorted)
        self._start = 0  # keys before it taken (a sorted list only)
        self._sorted = True

    def __len__(self) -> int:
        return len(self._keys) - self._start

    def _heap(self) -> list[int]:
        """The keys as a heap to push onto (a sorted list is one, once its taken front is dropped)."""
        if self._start:
            del self._keys[:self._start]
            self._start = 0
        self._sorted = False
        return self._keys

    def push(self, pos: int) -> None:
        heapq.heappush(self._heap(), enq_order_key(pos))

    def push_many(self, positions: list[int]) -> None:
        keys = swap_halves(positions)
        if not len(self):  # a closing channel's deliveries come nearly in enq order: sorted in one pass
            keys.sort()
            self._keys, self._start, self._sorted = keys, 0, True
            return
        if self._sorted and len(keys) * _REBUILD_SHARE >= len(self):
            # Another window onto sorted ones (a dropped connection's channels, one after the other):
            # two sorted runs, which one sort merges in a pass, and the list stays sorted.
            keys.sort()
            merged = self._keys[self._start:] if self._start else self._keys
            merged += keys
            merged.sort()
            self._keys, self._start = merged, 0
            return
        heap = self._heap()
        if len(keys) * _REBUILD_SHARE < len(heap):
            for key in keys:
                heapq.heappush(heap, key)
        else:
            heap += keys
            heapq.heapify(heap)

    def peek(self) -> int | None:
        return pos_from_order_key(self._keys[self._start]) if len(self) else None

    def pop(self) -> int:
        if not self._sorted:
            return pos_from_order_key(heapq.heappop(self._keys))
        return self.pop_many(1)[0]

    def pop_many(self, count: int) -> list[int]:
        """The first ``count`` (all, when fewer), in enq order."""
        keys = self._keys
        if not self._sorted and count < len(keys):
            pop = heapq.heappop
            return swap_halves([pop(keys) for _ in range(count)])
        if not self._sorted:
            keys.sort()
            self._sorted = True
        start = self._start
        taken = keys[start:start + count]
        start += len(taken)
        if start >= len(keys):
            keys.clear()
            start = 0
        elif start >= _DROP_TAKEN and start * 2 >= len(keys):
            del keys[:start]
            start = 0
        self._start = start
        return swap_halves(taken)

    def clear(self) -> None:
        self._keys, self._start, self._sorted = [], 0, True

    def positions(self) -> array:
        """Every one, in enq order."""
        return array("Q", (pos_from_order_key(key) for key in sorted(self.keys())))

    def keys(self) -> list[int]:
        """Their enq-order keys, in no order."""
        return self._keys[self._start:] if self._start else self._keys

    def memory_bytes(self) -> int:
        return sys.getsizeof(self._keys)


def swap_halves(values: list[int]) -> list[int]:
    """``enq_order_key`` of each position, or ``pos_from_order_key`` of each key (the same swap of the
    two 32-bit halves): an array operation over all, where a key computed one at a time made three big
    ints of each."""
    if len(values) < 64:
        return [((value & SEGMENT_MASK) << OFFSET_SHIFT) | (value >> OFFSET_SHIFT) for value in values]
    words = memoryview(positions_array(values)).cast("B").cast("I")  # low half, high half, low, ...
    lows, highs = array("I"), array("I")
    lows.frombytes(words[0::2].tobytes())
    highs.frombytes(words[1::2].tobytes())
    swapped = array("I", bytes(len(words) * 4))
    swapped[0::2], swapped[1::2] = highs, lows
    return memoryview(swapped).cast("B").cast("Q").tolist()
