"""One delivery a channel waits to have acknowledged."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from ..broker.consumer import Consumer
    from ..broker.queue_base import QueueKind


class Unacked(NamedTuple):
    queue: QueueKind
    pos: int
    consumer: Consumer | None  # None for basic.get


_new_tuple = tuple.__new__


def unacked_run(queue: QueueKind, positions: list[int], consumer: Consumer) -> list[Unacked]:
    """Unacked records for a run of deliveries to one consumer (tuple.__new__ skips the
    NamedTuple constructor's Python-level call per record)."""
    return [_new_tuple(Unacked, (queue, pos, consumer)) for pos in positions]
