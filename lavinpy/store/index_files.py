"""Index entries (8-byte positions, a queue's ``enq``/``ack``, a stream's ``enq``) in an ``array('Q')``:
segment ids and counts, checking entries against the segments' valid ends, and a queue's recovered
and compacted entries a bounded chunk at a time. The files themselves are entry_file.py's."""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from itertools import chain, filterfalse, islice
from typing import Any, Protocol

from lavinpy.store.accel import cstore
from lavinpy.wire.position import OFFSET_SHIFT, SEGMENT_MASK, enq_order_key, pos_from_order_key


class Positions(Protocol):
    """What ``live_chunks`` reads of a ready list (ready_list.py)."""

    def __len__(self) -> int: ...

    def peek(self) -> int | None: ...

    def to_bytes(self, start: int = 0, stop: int | None = None) -> bytes: ...


def segment_ids(entries: array) -> memoryview:
    """A strided uint32 view of the segment ids of an ``array('Q')`` (no copy)."""
    return memoryview(entries).cast("B").cast("I")[0::2]


def py_positions_array(positions: list[int]) -> array:
    """``array("Q", positions)``: the pure twin of ``positions_array``."""
    return array("Q", positions)


def _packed_positions_array(positions: list[int]) -> array:
    """``array("Q", positions)`` from the compiled ``pack_positions``: the array's own conversion of each
    int of more than one 30-bit digit (every position past a segment's first record) goes a byte at a
    time, about 300 instructions a position (a queue's run of acks)."""
    assert cstore is not None
    out = array("Q")
    out.frombytes(cstore.pack_positions(positions))
    return out


positions_array: Callable[[list[int]], array] = py_positions_array if cstore is None else _packed_positions_array


def py_packed_counts(positions: list[int]) -> tuple[memoryview, dict[int, int]]:
    """The bytes of ``array("Q", positions)`` (as ``array.frombytes`` takes them) and ``segment_counts``
    of the positions: the pure twin of the compiled ``pack_counted``, which counts while it packs."""
    packed = array("Q", positions)
    return memoryview(packed).cast("B"), segment_counts(packed)


def segment_counts(entries: array | list[int]) -> dict[int, int]:
    """How many of ``entries`` (an ``array('Q')`` or a list of positions) are in each segment. A short
    run of acks or pushes is usually all in one segment: checked in a loop that is cheaper than building
    a Counter for a few entries, and a long one by runs of equal segment ids (about 5 ns an entry, where
    a Counter costs 70-90)."""
    n = len(entries)
    if n <= 16:
        if not n:
            return {}
        first = entries[0] & SEGMENT_MASK
        for pos in entries:
            if pos & SEGMENT_MASK != first:
                break
        else:
            return {first: n}
    words = array("I")
    words.frombytes(memoryview(entries if type(entries) is array else array("Q", entries)).cast("B"))
    segments = words[0::2]  # as segment_ids, but an array: compared with one C loop
    # A publish run's positions lie in one segment, an ack's in a few ascending ones: count each run of
    # equal ids by bisection (as if sorted), then prove the guess by one comparison with the runs rebuilt.
    counts: dict[int, int] = {}
    i = 0
    while i < n and len(counts) < 64:
        segment = segments[i]
        if segment in counts:
            break
        j = bisect_right(segments, segment, i)
        if j <= i:
            break
        counts[segment] = j - i
        i = j
    if i == n:
        rebuilt = array("I")
        for segment, count in counts.items():
            rebuilt.extend(array("I", (segment,)) * count)
        if rebuilt == segments:
            return counts
    return Counter(segments)


def valid_entries(entries: array, valid_ends: dict[int, int]) -> tuple[array, dict[int, int], int]:
    """Drop entries whose segment is gone or whose offset is at/after the segment's valid end.

    Returns (valid entries, count per segment, number dropped). Fast path: entries of a queue are
    normally grouped by ascending segment, so each segment is one run found by bisection, the
    grouping is proved with one C-level comparison, and each run needs one ``max()``.
    """
    if not entries:
        return entries, {}, 0
    segs = segment_ids(entries)
    offsets = memoryview(entries).cast("B").cast("I")[1::2]
    runs: list[tuple[int, int, int]] = []
    n = len(segs)
    i = 0
    while i < n and len(runs) <= 4096:
        segment = segs[i]
        j = bisect_right(segs, segment, i)
        runs.append((segment, i, j))
        i = j
    if i == n and runs:
        expected = array("I")
        for segment, start, stop in runs:
            expected.extend(array("I", (segment,)) * (stop - start))
        grouped = segs == memoryview(expected)
        del expected
        if grouped and len({segment for segment, _, _ in runs}) == len(runs):
            all_valid = True
            for segment, start, stop in runs:
                end = valid_ends.get(segment)
                if end is None or max(offsets[start:stop]) >= end:
                    all_valid = False
                    break
            if all_valid:
                return entries, {segment: stop - start for segment, start, stop in runs}, 0
    segs.release()
    offsets.release()
    # slow path: not grouped, or some entries are invalid
    valid = array("Q", (p for p in entries if (p >> OFFSET_SHIFT) < valid_ends.get(p & SEGMENT_MASK, 0)))
    return valid, segment_counts(valid), len(entries) - len(valid)


def recovered_chunks(chunks: Iterable[array], acked: set[int] | None, valid_ends: dict[int, int]
                     ) -> Iterator[tuple[array, dict[int, int], int]]:
    """A queue's ``enq`` read a chunk at a time, minus ``acked``, checked by ``valid_entries``: for
    each chunk (valid entries, count per segment, number dropped)."""
    for chunk in chunks:
        if acked:
            chunk = array("Q", filterfalse(acked.__contains__, chunk))
        yield valid_entries(chunk, valid_ends)


def py_enq_sorted(positions: array, keys: list[int] | None = None) -> array:
    """``positions`` and the positions of enq-order ``keys``, together in enq order (by segment, then
    offset)."""
    return array("Q", map(pos_from_order_key, sorted(chain(keys or (), map(enq_order_key, positions)))))


def _compiled_enq_sorted(positions: array, keys: list[int] | None = None) -> array:
    assert cstore is not None
    out = array("Q")
    out.frombytes(cstore.enq_order_sort(positions, cstore.pack_positions(keys or [])))
    return out


# A queue's compaction sorts all its unacked messages (a million held the loop 0.42 s in Python).
enq_sorted: Callable[..., array] = py_enq_sorted if cstore is None else _compiled_enq_sorted


def live_chunks(older: array, ready: Positions, transient: set[int], size: int) -> Iterator[array]:
    """A compacted ``enq`` in chunks of at most ``size`` entries: the requeued and unacked messages
    (``older``, positions in enq order) and the ready list merged in enq order, minus ``transient``."""
    def persistent(chunk: array) -> array:
        return array("Q", filterfalse(transient.__contains__, chunk)) if transient else chunk

    first_newer = ready.peek()
    if first_newer is None or not older or enq_order_key(older[-1]) <= enq_order_key(first_newer):
        # the normal FIFO case: everything delivered is older than everything never delivered
        for start in range(0, len(older), size):
            yield persistent(older[start:start + size])
        for chunk in ready_chunks(ready, size):
            yield persistent(chunk)
        return
    # messages were pushed out of append order: merge entry by entry
    newer = (enq_order_key(p) for chunk in ready_chunks(ready, size) for p in chunk)
    merged = heapq.merge(map(enq_order_key, older), newer)
    while chunk := array("Q", (pos_from_order_key(k) for k in islice(merged, size))):
        yield persistent(chunk)


def ready_chunks(ready: Positions, size: int) -> Iterator[array]:
    """A ready list's positions in order, ``size`` at a time, read in place."""
    for start in range(0, len(ready), size):
        chunk = array("Q")
        chunk.frombytes(ready.to_bytes(start, start + size))
        yield chunk


def chunked_counts(chunks: Iterable[array]) -> dict[int, int]:
    """``segment_counts`` over many chunks."""
    totals: dict[int, int] = {}
    for chunk in chunks:
        for segment, n in segment_counts(chunk).items():
            totals[segment] = totals.get(segment, 0) + n
    return totals


# The pair a queue's run of acks needs: its index entries to append and its segments to release.
packed_counts: Callable[[list[int]], tuple[Any, dict[int, int]]] = (
    py_packed_counts if cstore is None else cstore.pack_counted)
