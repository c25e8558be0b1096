"""The priority level of a message: what the broker hands a priority queue's index.

A classic queue has priorities when declared with ``x-max-priority`` (a message without one is 0). A
quorum queue always has them, as RabbitMQ 4.3's: strict levels 0 to 31, a message without a priority
counting as 4 (the AMQP 1.0 default RabbitMQ 4 gives it), one above 31 as 31.
"""

from __future__ import annotations

from functools import partial

from ...store.index_kinds import ByPriority
from ...wire.properties import PropertiesError, peek_priority


def message_priority(properties: bytes, max_priority: int, default: int = 0) -> int:
    """The level of a message: its priority property capped to ``max_priority``; absent or unreadable:
    ``default``."""
    try:
        priority = peek_priority(properties)
    except PropertiesError:
        return default
    if priority is None:
        return default
    return min(priority, max_priority)


def priority_kind(max_priority: int, default: int = 0) -> ByPriority:
    """The index kind of a priority queue."""
    return ByPriority(max_priority, partial(message_priority, max_priority=max_priority, default=default))
