"""What every queue kind (classic, stream) offers the vhost and channels in the same way."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..store.record import CorruptRecord, StoredMessage
from ..wire.position import pos_offset, pos_segment

if TYPE_CHECKING:
    from .consumer import Consumer
    from .vhost import VHost


log = logging.getLogger("lavinpy.queue")


class QueueBase:
    """Shared state queries and record reading; each kind brings its index, delivery and acks."""

    corrupt_messages = 0  # damaged records found (and skipped) in this queue

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
        """Read a record. A damaged or missing one is reported and None is returned: the caller
        removes that one message from the queue and goes on with the rest."""
        try:
            return self.vhost.store.messages.read(pos)
        except (CorruptRecord, KeyError) as e:
            self.report_damaged(pos, e)
            return None

    def report_damaged(self, pos: int, error: Exception) -> None:
        """Log and count an unreadable message; dead-letter it (reason ``corrupt``) when its fields
        can still be read without the CRC and the queue has a dead-letter exchange."""
        self.corrupt_messages += 1
        self.vhost.corrupt_messages += 1
        log.error("vhost %r, queue %r: message at segment %d offset %d is damaged and skipped: %s",
                  self.vhost.name, self.name, pos_segment(pos), pos_offset(pos), error)
        if getattr(self, "settings", None) is None or self.settings.dead_letter_exchange is None:
            return
        salvaged = self.vhost.store.messages.salvage(pos)
        if salvaged is not None:
            self.vhost.dead_letter(self, salvaged, "corrupt")  # type: ignore[arg-type]
