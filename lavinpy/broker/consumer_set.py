"""A classic queue's consumers: O(1) add and remove, round-robin without scanning the others.

Thousands of consumers on one queue must not make each basic.consume or basic.cancel walk all of
them: registration order (single active consumer, iteration) is one dict, the round-robin ring
another (the consumer served goes to its end), and the priorities and exclusive flags are counted.

Nor must each delivery walk the consumers whose own prefetch window is full (with 1,000 consumers
at prefetch 10 nearly all of them are, most of the time): each consumer's place in the ring is a
serial number (its turn), the consumers that may take a message are a heap by turn, and a consumer
found with its window full is parked off the heap until its next credit (``Consumer.credit``, the
only step that lowers its unacked count) puts it back with its turn: the order served is the
ring's, as when every consumer was looked at in turn.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from heapq import heapify, heappop, heappush, heapreplace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .queue_consumer import QueueConsumer


class ConsumerSet:
    __slots__ = ("_order", "_ring", "_priorities", "_exclusive", "_turns", "_heap", "_next_turn", "_heap_valid")

    def __init__(self) -> None:
        self._order: dict[QueueConsumer, None] = {}
        self._ring: OrderedDict[QueueConsumer, None] = OrderedDict()
        self._priorities: dict[int, int] = {}  # priority -> number of consumers with it
        self._exclusive = 0
        # The ring as turns: a consumer's turn is the serial of its last move to the ring's end.
        self._turns: dict[QueueConsumer, int] = {}
        # (turn, consumer) of the consumers not parked; an entry whose turn is not the consumer's
        # present one is stale (served again since, or removed) and dropped when it comes up.
        self._heap: list[tuple[int, QueueConsumer]] = []
        self._next_turn = 0
        self._heap_valid = True  # False while priorities differ (the ring is scanned instead)
    def __len__(self) -> int:
        return len(self._order)

    def __bool__(self) -> bool:
        return bool(self._order)

    def __iter__(self) -> Iterator[QueueConsumer]:
        """Registration order."""
        return iter(self._order)

    def __contains__(self, consumer: object) -> bool:
        return consumer in self._order

    def add(self, consumer: QueueConsumer) -> None:
        self._order[consumer] = None
        self._ring[consumer] = None
        turn = self._next_turn
        self._next_turn = turn + 1
        self._turns[consumer] = turn
        consumer.parked = None
        if self._heap_valid:
            heappush(self._heap, (turn, consumer))
        priorities = self._priorities
        priorities[consumer.priority] = priorities.get(consumer.priority, 0) + 1
        if consumer.exclusive:
            self._exclusive += 1

    def remove(self, consumer: QueueConsumer) -> bool:
        """False when the consumer was not here."""
        if consumer not in self._order:
            return False
        del self._order[consumer]
        del self._ring[consumer]
        del self._turns[consumer]  # its heap entry, if any, is stale from now on
        consumer.parked = None
        if len(self._heap) > 2 * len(self._turns) + 64:
            self._heap_valid = False  # many stale entries: rebuilt at the next delivery
        priorities = self._priorities
        left = priorities[consumer.priority] - 1
        if left:
            priorities[consumer.priority] = left
        else:
            del priorities[consumer.priority]
        if consumer.exclusive:
            self._exclusive -= 1
        return True

    def first(self) -> QueueConsumer | None:
        """The earliest registered consumer (the single active consumer)."""
        for consumer in self._order:
            return consumer
        return None

    @property
    def has_exclusive(self) -> bool:
        return self._exclusive > 0

    def next_ready(self) -> QueueConsumer | None:
        """The next consumer with capacity in round-robin order; the highest priority wins when
        priorities differ. The one chosen goes to the end of the ring."""
        if len(self._priorities) > 1:
            return self._next_by_priority()
        if not self._heap_valid:
            self._rebuild_heap()
        heap = self._heap
        turns = self._turns
        skipped: list[tuple[int, QueueConsumer]] | None = None
        chosen: QueueConsumer | None = None
        while heap:
            entry = heap[0]
            turn, consumer = entry
            if turns.get(consumer) != turn:  # stale
                heappop(heap)
                continue
            if consumer.can_accept():
                chosen = consumer
                next_turn = self._next_turn
                self._next_turn = next_turn + 1
                turns[consumer] = next_turn
                heapreplace(heap, (next_turn, consumer))
                self._ring.move_to_end(consumer)
                break
            heappop(heap)
            if not consumer.no_ack and consumer.prefetch and consumer.unacked >= consumer.prefetch:
                consumer.parked = self  # its own window is full: back on its next credit
            else:  # its channel cannot take it now (flow, channel prefetch, output): looked at again next time
                if skipped is None:
                    skipped = []
                skipped.append(entry)
        if skipped is not None:
            for entry in skipped:
                heappush(heap, entry)
        return chosen

    def unpark(self, consumer: QueueConsumer) -> None:
        """A parked consumer got credit back: on the heap again, at its place in the ring."""
        consumer.parked = None
        turn = self._turns.get(consumer)
        if turn is not None and self._heap_valid:
            heappush(self._heap, (turn, consumer))

    def _next_by_priority(self) -> QueueConsumer | None:
        self._heap_valid = False  # turns are kept; the heap is rebuilt when priorities agree again
        chosen: QueueConsumer | None = None
        for consumer in self._ring:
            if consumer.can_accept() and (chosen is None or consumer.priority > chosen.priority):
                chosen = consumer
        if chosen is not None:
            self._ring.move_to_end(chosen)
            self._turns[chosen] = self._next_turn
            self._next_turn += 1
        return chosen

    def _rebuild_heap(self) -> None:
        turns = self._turns
        for consumer in turns:
            consumer.parked = None
        self._heap = heap = [(turn, consumer) for consumer, turn in turns.items()]
        heapify(heap)
        self._heap_valid = True
