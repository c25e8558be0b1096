"""A queue's unacked positions: a set, and the runs ``shift_many`` took kept whole.

A run of positions taken for one delivery run is acked back in the same order in the common case (a
consumer acking in delivery order, a channel closing), so the run stays one list, found by its next
unacked position: an ack of its head slice (or of several runs' one after the other: a multiple ack
spanning many delivery runs) is one comparison per run and no set operation per message. Any other
settlement first moves every run's positions into the set (``_spill``), which then answers as
a plain set would.

The set holds ``pos ^ (pos >> 32)``, not the position: a position's low 32 bits are its segment id,
the same for every message of a segment, and an int hashes to itself, so a set of positions put them
all on one probe chain (at 100,000 positions a lookup cost about 10 times a well-spread one). The
key mixes the offset into the low bits; it is its own inverse.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator


def _keys(positions: Iterable[int]) -> list[int]:
    """The set's keys of ``positions`` (also the positions of keys: the mapping is its own inverse)."""
    return [pos ^ (pos >> 32) for pos in positions]


class UnackedPositions:
    """Positions delivered and not yet settled (each position at most once)."""

    __slots__ = ("_loose", "_runs", "_in_runs")

    def __init__(self) -> None:
        self._loose: set[int] = set()
        self._runs: dict[int, list] = {}  # next unacked position -> [positions, offset of that one]
        self._in_runs = 0

    def add(self, pos: int) -> None:
        self._loose.add(pos ^ (pos >> 32))

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
                pos = part[0]
                self._loose.add(pos ^ (pos >> 32))
                self._in_runs -= 1

    def remove(self, pos: int) -> bool:
        """Settle ``pos``; False (nothing changed) when it is not unacked."""
        loose = self._loose
        key = pos ^ (pos >> 32)
        if key in loose:
            loose.remove(key)
            return True
        runs = self._runs
        if not runs:
            return False
        run = runs.pop(pos, None)
        if run is not None:  # the next of its run
            self._advance(run, 1)
            return True
        self._spill()
        if key in loose:
            loose.remove(key)
            return True
        return False

    def remove_many(self, positions: list[int]) -> int | None:
        """Settle every one of ``positions``: None, or (nothing changed) the index of the first that
        is not unacked."""
        loose = self._loose
        runs = self._runs
        if loose:
            keys = _keys(positions)
            if loose.issuperset(keys):
                loose.difference_update(keys)
                return None
        else:
            keys = None
        if runs and positions:
            heads = self._run_heads(positions)
            if heads is not None:  # head slices of runs (and loose ones), in order: acks in delivery order
                for head, run, count in heads:
                    if run is None:
                        loose.remove(head ^ (head >> 32))
                        continue
                    del runs[head]
                    self._advance(run, count)
                return None
            self._spill()
        if keys is None:
            keys = _keys(positions)
        if not loose.issuperset(keys):
            if runs:
                self._spill()
            for i, key in enumerate(keys):
                if key not in loose:
                    return i
        loose.difference_update(keys)
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
                if head ^ (head >> 32) not in loose:
                    return None
                seen.add(head)
                heads.append((head, None, 1))
                at += 1
                continue
            taken, offset = run
            count = min(len(taken) - offset, n - at)
            if taken[offset:offset + count] != positions[at:at + count]:
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
            loose.update(_keys(positions[offset:] if offset else positions))
        self._runs.clear()
        self._in_runs = 0

    def clear(self) -> None:
        self._loose.clear()
        self._runs.clear()
        self._in_runs = 0

    def __contains__(self, pos: object) -> bool:
        if self._runs:
            self._spill()
        return isinstance(pos, int) and pos ^ (pos >> 32) in self._loose

    def __len__(self) -> int:
        return len(self._loose) + self._in_runs

    def __iter__(self) -> Iterator[int]:
        if self._runs:
            self._spill()
        return iter(_keys(self._loose))

    def memory_bytes(self) -> int:
        """The set's size, and 8 bytes per position held in a run."""
        return sys.getsizeof(self._loose) + 8 * self._in_runs

    def positions(self) -> list[int]:
        """All of them."""
        if self._runs:
            self._spill()
        return _keys(self._loose)
