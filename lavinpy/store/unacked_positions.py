"""A queue's unacked positions: a set, and the runs ``shift_many`` took kept whole.

A run of positions taken for one delivery run is acked back in the same order in the common case (a
consumer acking in delivery order, a channel closing), so the run stays one list, found by its next
unacked position: an ack of its head slice (or of several runs' one after the other: a multiple ack
spanning many delivery runs) is one comparison per run and no set operation per message. Any other
settlement first moves every run's positions into the set (``_spill``), which then answers as
a plain set would.

The set is ``PositionSet`` from _cstore when built (8-byte keys in one open-addressed array: a Python
set of positions, whose hashes are their low bits, the segment id, probes long chains once it holds
the 100,000 positions of 1,000 consumers at prefetch 100), else a Python set; both answer alike
(tests/store/test_position_set.py).
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Iterator

from lavinpy.store.accel import cstore
from lavinpy.store.index_files import positions_array

PositionSet: type = cstore.PositionSet if cstore is not None else set


class UnackedPositions:
    """Positions delivered and not yet settled (each position at most once)."""

    __slots__ = ("_loose", "_runs", "_in_runs")

    def __init__(self) -> None:
        self._loose: set[int] = PositionSet()
        self._runs: dict[int, list] = {}  # next unacked position -> [positions, offset of that one]
        self._in_runs = 0

    def add(self, pos: int) -> None:
        self._loose.add(pos)

    def add_run(self, positions: list[int]) -> None:
        """Positions taken together (not empty; the list is kept, never changed here)."""
        self._runs[positions[0]] = [positions, 0]
        self._in_runs += len(positions)

    def split_run(self, taken: list[int], parts: list[list[int]]) -> None:
        """Hold the run ``taken`` (added by add_run, none of it settled yet) as ``parts`` instead: each
        part in order, together exactly its positions (the messages of one run that went to several
        consumers, each of which acks its own part in order). Anything else is left as it is."""
        run = self._runs.get(taken[0]) if taken else None
        if run is None or run[0] is not taken or run[1] or len(parts) < 2:
            return
        del self._runs[taken[0]]
        runs = self._runs
        for part in parts:
            if len(part) > 1:
                runs[part[0]] = [part, 0]
            elif part:  # one position (a round of one message per consumer): the set holds it as cheaply
                self._loose.add(part[0])
                self._in_runs -= 1

    def remove(self, pos: int) -> bool:
        """Settle ``pos``; False (nothing changed) when it is not unacked."""
        loose = self._loose
        if pos in loose:
            loose.remove(pos)
            return True
        runs = self._runs
        if not runs:
            return False
        run = runs.pop(pos, None)
        if run is not None:  # the next of its run
            self._advance(run, 1)
            return True
        self._spill()
        if pos in loose:
            loose.remove(pos)
            return True
        return False

    def remove_many(self, positions: list[int]) -> int | None:
        """Settle every one of ``positions``: None, or (nothing changed) the index of the first that
        is not unacked."""
        loose = self._loose
        if loose and loose.issuperset(positions):
            loose.difference_update(positions)
            return None
        runs = self._runs
        if runs and positions:
            heads = self._run_heads(positions)
            if heads is not None:  # head slices of runs (and loose ones), in order: acks in delivery order
                for head, run, count in heads:
                    if run is None:
                        loose.remove(head)
                        continue
                    del runs[head]
                    self._advance(run, count)
                return None
            self._spill()
        if not loose.issuperset(positions):
            if runs:
                self._spill()
            for i, pos in enumerate(positions):
                if pos not in loose:
                    return i
        loose.difference_update(positions)
        return None

    def _run_heads(self, positions: list[int]) -> list[tuple[int, list | None, int]] | None:
        """(next position, run, count) of each run whose head slice ``positions`` is made of, in
        order (a multiple ack of many delivery runs), with (position, None, 1) for one in the set;
        None when any part is neither."""
        runs = self._runs
        loose = self._loose
        heads: list[tuple[int, list | None, int]] = []
        seen: set[int] = set()
        at, n = 0, len(positions)
        while at < n:
            head = positions[at]
            if head in seen:
                return None
            run = runs.get(head)
            if run is None:
                if head not in loose:
                    return None
                seen.add(head)
                heads.append((head, None, 1))
                at += 1
                continue
            taken, offset = run
            count = min(len(taken) - offset, n - at)
            # (the run's own list, whole, needs no comparison: an ack of a whole delivery run)
            if (taken is not positions or offset or at) and taken[offset:offset + count] != positions[at:at + count]:
                return None
            seen.add(head)
            heads.append((head, run, count))
            at += count
        return heads

    def _advance(self, run: list, count: int) -> None:
        positions, offset = run
        offset += count
        self._in_runs -= count
        if offset < len(positions):
            run[1] = offset
            self._runs[positions[offset]] = run

    def _spill(self) -> None:
        """Every run's positions into the set: a settlement out of their order."""
        loose = self._loose
        for positions, offset in self._runs.values():
            loose.update(positions[offset:] if offset else positions)
        self._runs.clear()
        self._in_runs = 0

    def clear(self) -> None:
        self._loose.clear()
        self._runs.clear()
        self._in_runs = 0

    def __contains__(self, pos: object) -> bool:
        if self._runs:
            self._spill()
        return pos in self._loose

    def __len__(self) -> int:
        return len(self._loose) + self._in_runs

    def __iter__(self) -> Iterator[int]:
        if self._runs:
            self._spill()
        return iter(self._loose)

    def to_array(self) -> array:
        """Every position held, in no order, as an ``array('Q')``, the runs left as they are."""
        out = array("Q", self._loose)
        for positions, offset in self._runs.values():
            out.extend(positions_array(positions[offset:] if offset else positions))
        return out

    def memory_bytes(self) -> int:
        """The set's size, and 8 bytes per position held in a run."""
        return sys.getsizeof(self._loose) + 8 * self._in_runs

    def positions(self) -> Iterable[int]:
        """All of them (the set itself: read it before the next change)."""
        if self._runs:
            self._spill()
        return self._loose
