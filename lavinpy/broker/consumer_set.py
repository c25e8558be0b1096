"""A classic queue's consumers: O(1) add and remove, round-robin without scanning the others.

Thousands of consumers on one queue must not make each basic.consume or basic.cancel walk all of
them: registration order (single active consumer, iteration) is one dict, the round-robin ring
another (the consumer served goes to its end), and the priorities and exclusive flags are counted.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .queue_consumer import QueueConsumer


class ConsumerSet:
    __slots__ = ("_order", "_ring", "_priorities", "_exclusive")

    def __init__(self) -> None:
        self._order: dict[QueueConsumer, None] = {}
        self._ring: OrderedDict[QueueConsumer, None] = OrderedDict()
        self._priorities: dict[int, int] = {}  # priority -> number of consumers with it
        self._exclusive = 0

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
        ring = self._ring
        chosen: QueueConsumer | None = None
        if len(self._priorities) <= 1:
            for consumer in ring:
                if consumer.can_accept():
                    chosen = consumer
                    break
        else:
            for consumer in ring:
                if consumer.can_accept() and (chosen is None or consumer.priority > chosen.priority):
                    chosen = consumer
        if chosen is not None:
            ring.move_to_end(chosen)
        return chosen
