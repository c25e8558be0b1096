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
