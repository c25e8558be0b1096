"""A channel's unacked deliveries by delivery tag, kept as runs (``deliveries.Deliveries``' books).

One entry per delivery run with its positions, not one per message: acks in delivery order take
whole slices of the runs, and a consumer's run that continues the channel's last one (its share of
each round of a queue's deliveries) joins it.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator, Mapping
from operator import attrgetter
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from ..queues.base import QueueKind
    from ..queues.consumer import Consumer


class Unacked(NamedTuple):
    queue: QueueKind
    pos: int
    consumer: Consumer | None  # None for basic.get


_new_tuple = tuple.__new__


class _Run:
    """Deliveries with consecutive tags from ``first`` of one queue to one consumer (None: basic.get)."""

    __slots__ = ("first", "queue", "consumer", "positions", "done", "settled", "live", "owned")

    def __init__(self, first: int, queue: QueueKind, consumer: Consumer | None, positions: list[int],
                 owned: bool) -> None:
        self.first = first
        self.queue = queue
        self.consumer = consumer
        self.positions = positions  # not copied: never changed unless ``owned`` (a run of single deliveries)
        self.done = 0  # the leading entries already settled
        self.settled: set[int] | None = None  # offsets from ``done`` on settled out of order
        self.live = len(positions)
        self.owned = owned


_first_tag = attrgetter("first")
# Deliveries one at a time join the channel's last run up to this many: a run's list is freed only once
# all of it is settled, and a consumer that always has some unacked would otherwise grow it for good.
OWNED_RUN_MAX = 1024
# A piece of settled deliveries: their queue, their consumer and their positions, in delivery order.
Piece = tuple["QueueKind", "Consumer | None", list[int]]


class UnackedBook(Mapping[int, Unacked]):
    """A channel's unacked deliveries by delivery tag, in delivery order, kept as runs.

    Reads as a mapping of tag to ``Unacked``; ``take_consecutive`` and ``take_upto`` settle the
    common cases (acks in delivery order, basic.ack multiple) a slice of a run at a time."""

    __slots__ = ("_runs", "_head", "_count")

    def __init__(self) -> None:
        self._runs: list[_Run] = []
        self._head = 0  # runs before it are settled
        self._count = 0

    # --- booking ------------------------------------------------------------------------------
    def add(self, tag: int, queue: QueueKind, pos: int, consumer: Consumer | None) -> None:
        """One delivery; it joins the last run when it continues it."""
        runs = self._runs
        if len(runs) > self._head:
            last = runs[-1]
            if (last.owned and last.queue is queue and last.consumer is consumer and last.settled is None
                    and last.first + len(last.positions) == tag and len(last.positions) < OWNED_RUN_MAX):
                last.positions.append(pos)
                last.live += 1
                self._count += 1
                return
        runs.append(_Run(tag, queue, consumer, [pos], True))
        self._count += 1

    def add_run(self, first: int, queue: QueueKind, consumer: Consumer | None, positions: list[int]) -> None:
        """A run of deliveries, tags from ``first``; ``positions`` is kept as it is (not changed later),
        unless the run continues the channel's last one (a consumer's share of each round of a queue's
        deliveries): then it joins that run (whose list is copied once, the first time, as it may be
        the queue's too), so that in-order acks of several rounds take one slice of one run."""
        count = len(positions)
        runs = self._runs
        if len(runs) > self._head:
            last = runs[-1]
            if (last.queue is queue and last.consumer is consumer and last.settled is None
                    and last.first + len(last.positions) == first and len(last.positions) + count <= OWNED_RUN_MAX):
                if last.owned:
                    last.positions += positions
                else:
                    last.positions = last.positions + positions
                    last.owned = True
                last.live += count
                self._count += count
                return
        runs.append(_Run(first, queue, consumer, [positions[0]] if count == 1 else positions, count == 1))
        self._count += count

    def oldest(self) -> int | None:
        """The tag of the oldest unsettled delivery (None: none)."""
        runs = self._runs
        head = self._head
        if head >= len(runs):
            return None
        run = runs[head]  # (the head run has a live delivery, and the first of them is at ``done``)
        return run.first + run.done

    # --- the mapping ------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[int]:
        for run, offsets in self._unsettled():
            first = run.first
            for offset in offsets:
                yield first + offset

    def _unsettled(self) -> Iterator[tuple[_Run, Iterable[int]]]:
        """Each run with unsettled deliveries and their offsets in it, in delivery order."""
        for run in self._runs[self._head:]:
            if run.live:
                offsets = range(run.done, len(run.positions))
                settled = run.settled
                yield run, offsets if settled is None else [o for o in offsets if o not in settled]

    def __getitem__(self, tag: int) -> Unacked:
        run, offset = self._find(tag)
        if run is None:
            raise KeyError(tag)
        return _new_tuple(Unacked, (run.queue, run.positions[offset], run.consumer))

    def __contains__(self, tag: object) -> bool:
        return isinstance(tag, int) and self._find(tag)[0] is not None

    def _find(self, tag: int) -> tuple[_Run | None, int]:
        """The run holding the unsettled delivery ``tag`` and its offset there, or (None, 0)."""
        runs = self._runs
        head = self._head
        if head >= len(runs):
            return None, 0
        run = runs[head]
        if tag >= run.first + len(run.positions):
            i = bisect_right(runs, tag, head, len(runs), key=_first_tag) - 1
            if i < head:
                return None, 0
            run = runs[i]
        offset = tag - run.first
        if offset < run.done or offset >= len(run.positions) or (run.settled is not None and offset in run.settled):
            return None, 0
        return run, offset

    # --- settling ---------------------------------------------------------------------------------
    def pop(self, tag: int, default: Unacked | None = None) -> Unacked | None:
        """Settle the delivery ``tag``: its record, or ``default`` when it is not unacked."""
        run, offset = self._find(tag)
        if run is None:
            return default
        item = _new_tuple(Unacked, (run.queue, run.positions[offset], run.consumer))
        if offset == run.done:
            run.done += 1
            settled = run.settled
            if settled:
                while run.done in settled:
                    settled.discard(run.done)
                    run.done += 1
                if not settled:
                    run.settled = None
        elif run.settled is None:
            run.settled = {offset}
        else:
            run.settled.add(offset)
        run.live -= 1
        self._count -= 1
        if not run.live:
            self._drop_settled()
        return item

    def take_consecutive(self, first: int, count: int) -> list[Piece] | None:
        """Settle the deliveries with tags ``first`` .. ``first + count - 1`` when they are the oldest
        unsettled ones and settle whole run slices (acks in delivery order): their pieces. None (and
        nothing settled) otherwise."""
        runs = self._runs
        i = self._head
        end = len(runs)
        tag = first
        left = count
        spans: list[tuple[_Run, int]] = []
        while left:
            if i >= end:
                return None
            run = runs[i]
            if not run.live:
                i += 1
                continue
            if run.settled is not None or run.first + run.done != tag:
                return None
            take = min(left, run.live)
            spans.append((run, take))
            tag += take
            left -= take
            i += 1
        pieces: list[Piece] = []
        for run, take in spans:
            done = run.done
            pieces.append((run.queue, run.consumer, run.positions[done:done + take]))
            run.done = done + take
            run.live -= take
        self._count -= count
        self._drop_settled()
        return pieces

    def take_upto(self, tag: int) -> list[tuple[int, Piece]]:
        """Settle every delivery with a tag up to ``tag`` (0: all): (first tag, piece) per run slice,
        in delivery order."""
        runs = self._runs
        taken: list[tuple[int, Piece]] = []
        count = 0
        for i in range(self._head, len(runs)):
            run = runs[i]
            if not run.live:
                continue
            first, done, settled = run.first, run.done, run.settled
            if tag and first + done > tag:
                break
            stop = len(run.positions) if not tag else min(len(run.positions), tag - first + 1)
            if settled is None:
                positions = run.positions
                if done or stop < len(positions):
                    positions = positions[done:stop]
                # (a whole run goes as its own list: the queue's unacked run it is, acked without a copy)
                taken.append((first + done, (run.queue, run.consumer, positions)))
                run.live -= stop - done
                count += stop - done
            else:  # some settled out of order: the slices between them
                start = done
                for offset in range(done, stop + 1):
                    if offset == stop or offset in settled:
                        if offset > start:
                            taken.append((first + start, (run.queue, run.consumer, run.positions[start:offset])))
                            run.live -= offset - start
                            count += offset - start
                        start = offset + 1
                run.settled = {o for o in settled if o >= stop} or None
            run.done = stop
            if run.settled is not None:  # settled ones right after the slice move the start on
                while run.done in run.settled:
                    run.settled.discard(run.done)
                    run.done += 1
                if not run.settled:
                    run.settled = None
        self._count -= count
        self._drop_settled()
        return taken

    def take_all(self) -> list[tuple[int, Unacked]]:
        """Settle every delivery: (tag, record) of each, in delivery order (read off the runs, not looked
        up a tag at a time: a closing channel may hold a stream consumer's 65,535)."""
        items = [(run.first + offset, _new_tuple(Unacked, (run.queue, run.positions[offset], run.consumer)))
                 for run, offsets in self._unsettled() for offset in offsets]
        self._runs = []
        self._head = self._count = 0
        return items

    def take_all_pieces(self) -> list[Piece]:
        """Settle every delivery, as ``take_all``, but as pieces (queue, consumer, positions), in
        delivery order: a closing channel's runs go back to their queues without a record a delivery."""
        pieces: list[Piece] = []
        for run, offsets in self._unsettled():
            positions = run.positions
            if type(offsets) is not range:  # some settled out of order
                positions = [positions[offset] for offset in offsets]
            elif run.done:
                positions = positions[run.done:]
            pieces.append((run.queue, run.consumer, positions))
        self._runs = []
        self._head = self._count = 0
        return pieces

    def restore(self, items: list[tuple[int, Unacked]]) -> None:
        """Deliveries settled and given back (tx.rollback): unacked again, in delivery order."""
        merged = sorted([*self.items(), *items])
        self._runs = []
        self._head = self._count = 0
        for tag, (queue, pos, consumer) in merged:
            self.add(tag, queue, pos, consumer)

    def _drop_settled(self) -> None:
        """Move the head past settled runs; drop them from the list once they are many."""
        runs = self._runs
        head = self._head
        end = len(runs)
        while head < end and not runs[head].live:
            head += 1
        if head == end:
            runs.clear()
            head = 0
        elif head > 32 and head * 2 > end:
            del runs[:head]
            head = 0
        self._head = head
