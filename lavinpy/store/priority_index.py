"""The index of an ``x-max-priority`` queue: highest priority first, FIFO within a priority.

A ``PriorityIndex`` is a ``QueueIndex`` (same ``enq``/``ack`` files, durability, compaction, flush and
close) with its own ready list, split by priority: one transient ``QueueIndex`` per level holds that
level's ready positions in its packed chunks, so a message still costs ~8 bytes in memory. The
per-level lists do no reference counting (the outer index does it, once per message). The level of
a message is the broker's business: it hands the level in with ``push`` and, for recovered messages,
gives ``priority_of`` (property block -> level) at construction. Within a level the order is the
``enq`` order, so FIFO within a priority holds across restarts; a compacted ``enq`` keeps each
level's order (levels are written one after the other). A run of one level (``push_many`` with
its level, ``shift_many``, ``ack_many``) goes to that level whole, as a FIFO queue's run does.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from lavinpy.store.message_store import MissingRecord
from lavinpy.store.queue_index import DEFAULT_ACK_FILE_MAX_BYTES, QueueIndex
from lavinpy.store.record import CorruptRecord

if TYPE_CHECKING:
    from lavinpy.store.message_store import MessageStore

MAX_PRIORITY = 255


class _NoRefs:
    """Stands in for the message store of the per-level lists: only the outer index counts references."""

    @staticmethod
    def incref(segment_id: int, n: int = 1) -> None:
        pass

    decref = incref


_NO_REFS = _NoRefs()


class _Level(QueueIndex):
    """The ready list of one level (transient): the outer index keeps the files and references, so a
    run here is only counted."""

    def record_push_many(self, positions: array, persistent: bool) -> None:
        self._ready_count += len(positions)

    def ack_many(self, positions: list[int]) -> None:
        bad = self._unacked.remove_many(positions)
        if bad is not None:
            raise KeyError(f"queue {self.name!r}: position {positions[bad]:#x} is not unacked")


class PriorityIndex(QueueIndex):
    """A QueueIndex whose ready messages come out by priority (``push(pos, persistent, priority)``)."""

    def __init__(self, name: str, messages: MessageStore, directory: Path | None,
                 ack_file_max_bytes: int = DEFAULT_ACK_FILE_MAX_BYTES, *, max_priority: int,
                 priority_of: Callable[[bytes], int], close_fd: Callable[[int], None] = os.close) -> None:
        if not 1 <= max_priority <= MAX_PRIORITY:
            raise ValueError(f"max_priority must be between 1 and {MAX_PRIORITY}, not {max_priority}")
        self.max_priority = max_priority
        self.priority_of = priority_of
        self._levels: list[QueueIndex | None] = [None] * (max_priority + 1)  # created on first use
        self._top = -1  # no level above this one has ready messages
        # The levels with unacked positions (usually one): an unacked position is asked of them, so
        # nothing is kept per message and the runs shift_many took stay whole in their level too.
        self._holders: dict[int, QueueIndex] = {}
        super().__init__(name, messages, directory, ack_file_max_bytes, close_fd=close_fd)

    def _level(self, level_no: int) -> QueueIndex:
        level = self._levels[level_no]
        if level is None:
            level = _Level(f"{self.name} [priority {level_no}]", _NO_REFS, None)  # type: ignore[arg-type]
            level.open()
            self._levels[level_no] = level
        return level

    def _clamp(self, priority: int | None) -> int:
        if priority is None or priority < 0:
            return 0
        return min(priority, self.max_priority)

    def _top_level(self) -> int:
        """The highest level with ready messages, or -1 (amortised O(1): _top only moves down here)."""
        levels = self._levels
        top = self._top
        while top >= 0:
            level = levels[top]
            if level is not None and level.ready_count:
                break
            top -= 1
        self._top = top
        return top

    # ---- loading -----------------------------------------------------------------------------

    def load_ready(self, live: array) -> None:
        """Spread the recovered positions over the levels, asking the broker for each one's level."""
        read = self.messages.read
        for pos in live:
            try:
                level_no = self._clamp(self.priority_of(read(pos).properties))
            except (CorruptRecord, MissingRecord):
                level_no = 0  # the queue reports it when it tries to deliver it
            self._level(level_no).push(pos)
            if level_no > self._top:
                self._top = level_no
        self.record_loaded(len(live))

    # ---- the message flow --------------------------------------------------------------------

    def push(self, pos: int, persistent: bool = True, priority: int | None = None) -> None:
        """Append a message to the tail of its level. ``priority=None`` asks ``priority_of``."""
        if priority is None:
            priority = self.priority_of(self.messages.read(pos).properties)
        level_no = self._clamp(priority)
        self._level(level_no).push(pos)
        if level_no > self._top:
            self._top = level_no
        self.record_push(pos, persistent)

    def push_many(self, positions: array, persistent: bool, priority: int | None = None) -> None:
        """``push`` for a run: at the tail of level ``priority`` together; ``None`` asks
        ``priority_of`` for each one."""
        if priority is None:
            for pos in positions:
                self.push(pos, persistent)
            return
        level_no = self._clamp(priority)
        self._level(level_no).push_many(positions, persistent)
        if level_no > self._top:
            self._top = level_no
        self.record_push_many(positions, persistent)

    def shift_many(self, count: int) -> list[int]:
        """``shift`` up to ``count`` times: highest level first, each level's share taken as a run."""
        taken: list[int] = []
        while len(taken) < count:
            top = self._top_level()
            if top < 0:
                break
            level = self._levels[top]
            got = level.shift_many(count - len(taken))  # type: ignore[union-attr]
            if not got:
                break
            self._holders[top] = level  # type: ignore[assignment]
            # one level (the usual case): the very list its level holds as a run; else a new list
            # (a level's run is never changed)
            taken = taken + got if taken else got
        if taken:
            self._ready_count -= len(taken)
            self._unacked.add_run(taken)
        return taken

    def split_taken(self, taken: list[int], parts: list[list[int]]) -> None:
        super().split_taken(taken, parts)
        for level in self._holders.values():  # the level whose run it is (when one level gave them all)
            level.split_taken(taken, parts)

    def _holder_of(self, pos: int) -> int:
        """The level that holds the unacked ``pos`` (KeyError if none does). With one level holding
        unacked positions, that one, unasked: its own ack or requeue then raises the KeyError (asking
        would spill its runs into a set)."""
        holders = self._holders
        if len(holders) == 1:
            return next(iter(holders))
        for level_no, level in holders.items():
            if level.is_unacked(pos):
                return level_no
        raise KeyError(f"queue {self.name!r}: position {pos:#x} is not unacked")

    def _forget_holder(self, level_no: int) -> None:
        if not self._holders[level_no].unacked_count:
            del self._holders[level_no]

    def ack_many(self, positions: list[int]) -> None:
        """``ack`` for many unacked positions: each level's share at once, then the index's."""
        if not positions:
            return
        holders = self._holders
        if len(holders) == 1:  # one level holds every unacked position: nothing to sort out
            (level_no, level), = holders.items()
            level.ack_many(positions)  # (KeyError, nothing changed, if one is not unacked)
            self._forget_holder(level_no)
        else:
            shares: dict[int, list[int]] = {}
            for pos in positions:  # every level first asked, so that a bad position changes nothing
                shares.setdefault(self._holder_of(pos), []).append(pos)
            for level_no, share in shares.items():
                holders[level_no].ack_many(share)
                self._forget_holder(level_no)
        super().ack_many(positions)  # (after the levels: compaction lists their unacked positions)

    def peek(self) -> int | None:
        top = self._top_level()
        return None if top < 0 else self._levels[top].peek()  # type: ignore[union-attr]

    def peek_priority(self) -> int | None:
        """The level of the next message to deliver, or None when there is none."""
        top = self._top_level()
        return None if top < 0 else top

    def shift(self) -> int | None:
        top = self._top_level()
        if top < 0:
            return None
        level = self._levels[top]
        pos = level.shift()  # type: ignore[union-attr]
        assert pos is not None
        self.record_shift(pos)
        self._holders[top] = level  # type: ignore[assignment]
        return pos

    def ack(self, pos: int) -> None:
        level_no = self._holder_of(pos)
        # Leave the level first: the base ack may compact, and compaction lists the levels' unacked.
        self._holders[level_no].ack(pos)
        self._forget_holder(level_no)
        super().ack(pos)

    def requeue(self, pos: int) -> None:
        """Back to the head of its own level, ahead of never-delivered messages of that level."""
        level_no = self._holder_of(pos)
        self._holders[level_no].requeue(pos)
        self._forget_holder(level_no)
        self.record_requeue(pos)
        if level_no > self._top:
            self._top = level_no

    def purge(self) -> int:
        if self.ready_count == 0:
            return 0
        removed = self.ready_positions()
        for level in self._levels:
            if level is not None:
                level.purge()
        self._top = -1
        return self.record_purge(removed)

    def ready_by_priority(self) -> dict[int, int]:
        """Ready messages per level (levels with none are left out)."""
        return {n: level.ready_count for n, level in enumerate(self._levels) if level is not None and level.ready_count}

    def __iter__(self) -> Iterator[int]:
        """Ready positions in delivery order."""
        for level in reversed(self._levels):
            if level is not None:
                yield from level

    def ready_positions(self) -> array:
        out = array("Q")
        for level in reversed(self._levels):
            if level is not None:
                out.extend(level.ready_positions())
        return out

    def live_positions(self) -> array:
        """Ready and unacked positions, level after level, each level in enq order."""
        out = array("Q")
        for level in self._levels:
            if level is not None:
                out.extend(level.live_positions())
        return out

    def delete(self) -> None:
        super().delete()
        for level in self._levels:
            if level is not None:
                level.delete()
        self._levels = [None] * (self.max_priority + 1)
        self._holders.clear()
        self._top = -1

    def __repr__(self) -> str:
        kind = "durable" if self.durable else "transient"
        return (f"PriorityIndex({self.name!r}, {kind}, max_priority={self.max_priority}, "
                f"ready={self.ready_count}, unacked={self.unacked_count})")
