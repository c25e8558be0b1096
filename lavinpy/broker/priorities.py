"""The priority level of a message: what the broker hands a priority queue's index."""

from __future__ import annotations

from functools import partial

from ..store.index_kinds import ByPriority
from ..wire.properties import PropertiesError, peek_priority


def message_priority(properties: bytes, max_priority: int) -> int:
    """The level of a message: its priority property capped to ``max_priority``; absent or unreadable: 0."""
    try:
        priority = peek_priority(properties)
    except PropertiesError:
        return 0
    if priority is None:
        return 0
    return min(priority, max_priority)


def priority_kind(max_priority: int) -> ByPriority:
    """The index kind of an x-max-priority queue."""
    return ByPriority(max_priority, partial(message_priority, max_priority=max_priority))
