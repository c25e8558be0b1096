"""Server-side offset tracking of stream consumers (LavinMQ's ``x-stream-automatic-offset-tracking``).

A consumer with a name of its own (a consumer tag the client chose, not a server-generated
``amq.ctag-...``) is tracked unless it says ``x-stream-automatic-offset-tracking: false``; one with a
generated tag only when it says ``true``. Its stored offset is the first offset it has not settled:
the lowest of its unacknowledged deliveries, or the next offset after everything delivered when none
is unacknowledged, with the offsets after it that were settled out of order. So a consumer that comes
back with the same tag and no ``x-stream-offset`` gets exactly what it had not settled and what is
new, never starting past a message it did not acknowledge (a nack with requeue keeps the message
unsettled; an ack or a reject settles it).

The offsets live in ``consumer_offsets.json`` in the stream's directory (tag -> offset, or
[offset, [offsets after it settled]]). They are
written by ``flush`` (the vhost's periodic task, a consumer leaving, the vhost closing): a kill -9
loses at most the last period's progress, which only means messages delivered again, never skipped.
"""

from __future__ import annotations

import logging
from collections import deque
from pathlib import Path
from typing import Any

from ...store.jsonfile import read_json, write_json_atomic

log = logging.getLogger("lavinpy.stream")

OFFSETS_FILE = "consumer_offsets.json"
# Tags kept per stream at most, the least recently moved dropped first: clients that make up a tag
# per consumer (pika's ctag1.<uuid>) would otherwise grow the file without end.
MAX_TAGS = 10_000
TRACKING = "x-stream-automatic-offset-tracking"
GENERATED_TAG = "amq.ctag-"


class OffsetTrackingError(ValueError):
    """A malformed tracking argument; the text is the reply's."""


def tracking_requested(tag: str, arguments: dict[str, Any] | None) -> bool:
    """Whether a consumer with this tag and these arguments is tracked; OffsetTrackingError if the
    argument is not a boolean."""
    value = (arguments or {}).get(TRACKING)
    if value is None:
        return not tag.startswith(GENERATED_TAG)
    if not isinstance(value, bool):
        raise OffsetTrackingError(f"{TRACKING} must be a boolean")
    return value


class _Live:
    __slots__ = ("tag", "unsettled", "positions", "offsets", "head", "next", "settled", "prune_at")

    def __init__(self, tag: str, start: int, settled: frozenset[int] = frozenset()) -> None:
        self.tag = tag
        self.unsettled: dict[int, int] = {}  # position -> offset of each unacknowledged delivery
        # The deliveries' positions and offsets in the order they went out (ascending offsets) from
        # ``head`` on: the first one still unsettled is the committed offset, found in amortised O(1);
        # a multiple ack of the oldest ones moves ``head`` past them at once (``take_oldest``).
        self.positions: list[int] = []
        self.offsets: list[int] = []
        self.head = 0
        self.next = start  # the offset after the last one delivered
        self.settled = set(settled)  # offsets settled past the first unsettled one (out of order)
        self.prune_at = 64  # the size of ``settled`` at which those the committed offset passed go

    def delivered(self, positions: Any, first_offset: int) -> None:
        offsets = range(first_offset, first_offset + len(positions))
        self.positions.extend(positions)
        self.offsets.extend(offsets)
        self.unsettled.update(zip(positions, offsets, strict=True))
        self.next = max(self.next, offsets.stop)

    def committed(self) -> int:
        positions, unsettled = self.positions, self.unsettled
        head, end = self.head, len(positions)
        while head < end and positions[head] not in unsettled:
            head += 1
        self._advance(head)
        return self.offsets[self.head] if self.head < len(self.positions) else self.next

    def take_oldest(self, positions: list[int]) -> bool:
        """Settle ``positions`` if they are this consumer's oldest unsettled deliveries, in order (the
        usual multiple ack): in a few calls, none a delivery. False (nothing done) otherwise."""
        self.committed()
        head, count = self.head, len(positions)
        if not count or self.positions[head:head + count] != positions:
            return False
        deque(map(self.unsettled.pop, positions), maxlen=0)
        self._advance(head + count)
        return True

    def _advance(self, head: int) -> None:
        if head > 4096 and 2 * head > len(self.positions):  # the settled front dropped, amortised
            del self.positions[:head], self.offsets[:head]
            head = 0
        self.head = head

    def stored_form(self) -> int | list[Any]:
        """The stored offset, and the offsets after it already settled (out-of-order acks), which a
        consumer resuming there does not get again."""
        offset = self.committed()
        if self.settled:
            self.settled = {o for o in self.settled if o > offset}
            self.prune_at = 2 * len(self.settled) + 64  # amortised: pruned again after as many more
        return [offset, sorted(self.settled)] if self.settled else offset


class OffsetTracker:
    """The tracked offsets of one stream, and its tracked consumers' unsettled deliveries."""

    def __init__(self, directory: Path, stream: str) -> None:
        self.path = Path(directory) / OFFSETS_FILE
        self.stored: dict[str, int] = {}
        self.settled_after: dict[str, frozenset[int]] = {}  # tag -> offsets after its stored one it settled
        self._live: dict[object, _Live] = {}
        self._moved: set[_Live] = set()  # consumers whose offset may have moved since the last _sync
        self._dirty = False
        try:
            loaded = read_json(self.path, {})
        except (OSError, ValueError) as e:
            log.error("stream %r: the tracked consumer offsets cannot be read (%s); consumers start afresh", stream, e)
            loaded = {}
        if isinstance(loaded, dict):
            for tag, value in loaded.items():
                offset, settled = _parse_stored(value)
                if offset is not None:
                    self.stored[str(tag)] = offset
                    if settled:
                        self.settled_after[str(tag)] = settled

    def resume_offset(self, tag: str) -> int | None:
        self._sync()
        return self.stored.get(tag)

    def resume_skips(self, tag: str) -> frozenset[int]:
        """The offsets after the tag's stored one that it already settled."""
        self._sync()
        return self.settled_after.get(tag, frozenset())

    def attach(self, consumer: object, tag: str, start: int, settled: frozenset[int] = frozenset()) -> None:
        self._live[consumer] = _Live(tag, start, frozenset(o for o in settled if o > start))
        self._commit(self._live[consumer])

    def tracks(self, consumer: object) -> bool:
        return consumer in self._live

    def delivered(self, consumer: object, pos: int, offset: int) -> None:
        self.delivered_run(consumer, (pos,), offset)

    def delivered_run(self, consumer: object, positions: Any, first_offset: int) -> None:
        live = self._live.get(consumer)
        if live is not None:
            live.delivered(positions, first_offset)
            self._commit(live)

    def settled_many(self, positions: list[int]) -> None:
        """``settled`` for each of ``positions`` (in delivery order): in a few calls for a consumer
        whose oldest unsettled deliveries they are (a multiple ack's usual form)."""
        for live in self._live.values():
            if not live.take_oldest(positions):
                for pos in positions:
                    self._settle(live, pos)
            self._commit(live)

    def settled(self, pos: int) -> None:
        for live in self._live.values():
            if self._settle(live, pos):
                self._commit(live)

    @staticmethod
    def _settle(live: _Live, pos: int) -> bool:
        """Whether ``pos`` was one of the consumer's unsettled deliveries (now settled)."""
        offset = live.unsettled.pop(pos, None)
        if offset is None:
            return False
        if live.unsettled and offset > live.committed():
            live.settled.add(offset)  # out of order: remembered until the offset passes it
            if len(live.settled) > live.prune_at:
                live.stored_form()  # drops those the committed offset has passed
        return True

    def detach(self, consumer: object) -> None:
        live = self._live.pop(consumer, None)
        if live is not None:
            self._commit(live)
            self.flush()

    def drop(self) -> None:
        """The stream is deleted: nothing more to track or write."""
        self._live.clear()
        self._moved.clear()
        self._dirty = False

    @property
    def active(self) -> bool:
        """Whether any consumer is tracked now (settlements need looking at)."""
        return bool(self._live)

    def rows(self) -> list[dict[str, Any]]:
        """Each tag's stored offset as the API shows it, the most recently moved last; ``consumers``
        counts the consumers with that tag attached now."""
        self._sync()
        attached: dict[str, int] = {}
        for live in self._live.values():
            attached[live.tag] = attached.get(live.tag, 0) + 1
        return [{"consumer_tag": tag, "offset": offset, "consumers": attached.get(tag, 0)}
                for tag, offset in self.stored.items()]

    def attached(self, tag: str) -> bool:
        return any(live.tag == tag for live in self._live.values())

    def forget(self, tag: str) -> bool:
        """Delete a tag's stored offset (its next consumer starts where its arguments say)."""
        self._sync()
        found = self.stored.pop(tag, None) is not None
        self.settled_after.pop(tag, None)
        if found:
            self._dirty = True
            self.flush()
        return found

    def flush(self) -> None:
        self._sync()
        if not self._dirty:
            return
        try:
            stored: dict[str, int | list[Any]] = {
                tag: [offset, sorted(self.settled_after[tag])] if tag in self.settled_after else offset
                for tag, offset in self.stored.items()}
            write_json_atomic(self.path, stored)  # in the order they moved (the oldest first)
        except OSError as e:
            log.error("stream offsets %s not written: %s", self.path, e)
            return
        self._dirty = False

    def _commit(self, live: _Live) -> None:
        """The consumer's offset may have moved: worked out at the next _sync (an ack costs a set add)."""
        self._moved.add(live)

    def _sync(self) -> None:
        """Bring ``stored`` up to the moved consumers' offsets."""
        if not self._moved:
            return
        moved, self._moved = self._moved, set()
        stored = self.stored
        for live in moved:
            form = live.stored_form()
            offset, settled = (form[0], frozenset(form[1])) if isinstance(form, list) else (form, frozenset())
            if stored.get(live.tag) == offset and self.settled_after.get(live.tag, frozenset()) == settled:
                continue
            stored.pop(live.tag, None)  # to the end: the most recently moved
            stored[live.tag] = offset
            if settled:
                self.settled_after[live.tag] = settled
            else:
                self.settled_after.pop(live.tag, None)
            self._dirty = True
        if len(stored) > MAX_TAGS:
            live_tags = {other.tag for other in self._live.values()}
            for tag in [t for t in stored if t not in live_tags][:len(stored) - MAX_TAGS]:
                del stored[tag]
                self.settled_after.pop(tag, None)

def _parse_stored(value: Any) -> tuple[int | None, frozenset[int]]:
    """A stored entry: an offset, or [offset, [offsets after it already settled]]."""
    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)
    if is_int(value):
        return value, frozenset()
    if isinstance(value, list) and len(value) == 2 and is_int(value[0]) and isinstance(value[1], list):
        return value[0], frozenset(v for v in value[1] if is_int(v) and v > value[0])
    return None, frozenset()
