"""What every queue kind (classic, stream) offers the vhost and channels in the same way."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..store.record import CorruptRecord, StoredMessage

if TYPE_CHECKING:
    from .consumer import Consumer
    from .vhost import VHost


class QueueBase:
    """Shared state queries and record reading; each kind brings its index, delivery and acks."""

    name: str
    vhost: VHost
    index: Any
    consumers: list[Consumer]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} vhost={self.vhost.name!r}>"

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    @property
    def closed(self) -> bool:
        return self.index.closed

    def is_unused(self) -> bool:
        return not self.consumers

    def has_exclusive_consumer(self) -> bool:
        return any(c.exclusive for c in self.consumers)

    def read(self, pos: int) -> StoredMessage | None:
        """Read a record; a damaged one closes this queue (and only this queue)."""
        try:
            return self.vhost.store.messages.read(pos)
        except (CorruptRecord, KeyError) as e:
            self.close_damaged(f"unreadable message at segment position {pos:#x}: {e}")
            return None

    def close_damaged(self, reason: str) -> None:
        raise NotImplementedError  # each kind closes itself and cancels its consumers
