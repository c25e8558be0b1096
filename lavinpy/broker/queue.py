"""A queue: its store index, its consumers, and the delivery loop that feeds them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..store.record import StoredMessage
from .consumer_set import ConsumerSet
from .queue_base import QueueBase
from .queue_features import QueueFeatures

if TYPE_CHECKING:
    from ..store.queue_index import QueueIndex
    from .arguments import QueueSettings
    from .consumer import Consumer
    from .vhost import VHost

log = logging.getLogger("lavinpy.queue")

# Deliveries made in one go before other queues get a turn on the event loop.
DELIVERY_BATCH = 256


class Queue(QueueBase, QueueFeatures):
    """A classic queue. Optional features (TTL, limits, priorities, ...) live in ``QueueFeatures``;
    ``special`` is False unless the queue uses one, and the hot paths below test only that flag."""

    is_stream = False

    def __init__(
        self,
        vhost: VHost,
        name: str,
        index: QueueIndex,
        *,
        durable: bool,
        exclusive_owner: object | None = None,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
        recovered_redelivered: bool = False,
        settings: QueueSettings | None = None,
    ) -> None:
        self.vhost = vhost
        self.name = name
        self.index = index
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.exclusive = exclusive_owner is not None
        self.auto_delete = auto_delete
        self.arguments = arguments or {}
        self.consumers = ConsumerSet()
        self.deleted = False
        self._had_consumer = False
        # Positions to deliver with redelivered=true: requeued ones, and after an unclean stop the
        # messages recovered from disk (their delivery state was not persisted).
        self._redelivered: set[int] = set()
        self._recovered_left = index.ready_count if recovered_redelivered else 0
        self.init_features(settings)

    # --- state --------------------------------------------------------------------------------
    @property
    def message_count(self) -> int:
        return self.index.ready_count

    def redelivered_positions(self) -> list[int]:
        return sorted(self._redelivered)

    def mark_redelivered(self, positions: Iterable[int]) -> None:
        self._redelivered.update(positions)

    # --- messages in --------------------------------------------------------------------------
    def push(self, pos: int, persistent: bool, message: StoredMessage | None = None) -> None:
        if self.special:
            self._push_special(pos, persistent, message)
            return
        index = self.index
        if message is not None and self.consumers and not index.ready_count:
            # Nothing waiting: hand the message in hand straight to a consumer with capacity,
            # instead of reading it back from its segment later. It is stored and indexed all the same.
            consumer = self._next_consumer()
            if consumer is not None:
                self._recovered_left = 0
                if consumer.no_ack:
                    # Delivered and settled at once: the index would only add and remove it.
                    consumer.channel.deliver(consumer, pos, message, False)
                    return
                index.push(pos, persistent)
                index.shift()
                consumer.channel.deliver(consumer, pos, message, False)
                consumer.unacked += 1
                return
        index.push(pos, persistent)
        if self.consumers:
            self.vhost.schedule_delivery(self)

    # --- messages out -------------------------------------------------------------------------
    def _shift(self) -> tuple[int, bool] | None:
        pos = self.index.shift()
        if pos is None:
            return None
        if pos in self._redelivered:
            self._redelivered.discard(pos)
            return pos, True
        if self._recovered_left:
            self._recovered_left -= 1
            return pos, True
        return pos, False

    def get(self) -> tuple[int, StoredMessage, bool] | None:
        """basic.get: the head message (now unacked), or None."""
        if self.closed:
            return None
        self.touch()
        if self.special:
            return self._get_special()
        while True:
            shifted = self._shift()
            if shifted is None:
                return None
            pos, redelivered = shifted
            msg = self.read(pos)
            if msg is not None:
                return pos, msg, redelivered
            self.index.ack(pos)  # damaged: reported by read(), removed, the next one is tried

    def deliver(self) -> bool:
        """Deliver ready messages to consumers with capacity; True if more could go out now."""
        if self.special:
            return self._deliver_special()
        budget = DELIVERY_BATCH
        index = self.index
        while budget and index.ready_count and self.consumers and not index.closed:
            consumer = self._next_consumer()
            if consumer is None:
                return False
            shifted = self._shift()
            if shifted is None:
                return False
            pos, redelivered = shifted
            msg = self.read(pos)
            if msg is None:  # damaged: reported by read(); removed, and the rest goes on
                index.ack(pos)
                continue
            consumer.channel.deliver(consumer, pos, msg, redelivered)
            if consumer.no_ack:
                index.ack(pos)
            else:
                consumer.unacked += 1
            budget -= 1
        return budget == 0

    def _next_consumer(self) -> Consumer | None:
        return self.consumers.next_ready()

    # --- acknowledgements ---------------------------------------------------------------------
    def ack(self, pos: int) -> None:
        if not self.deleted:
            if self._delivery_counts:
                self._delivery_counts.pop(pos, None)
            self.index.ack(pos)

    def requeue(self, pos: int) -> None:
        if self.deleted:
            return
        if self.special:
            self._requeue_special(pos)
            return
        self.index.requeue(pos)
        self._redelivered.add(pos)
        if self.consumers:
            self.vhost.schedule_delivery(self)

    def purge(self) -> int:
        count = self.index.purge()
        if self._delivery_counts:
            self.forget_purged_counts()
        self._recovered_left = 0
        self._ready_bytes = 0
        return count

    # --- consumers ----------------------------------------------------------------------------
    def has_exclusive_consumer(self) -> bool:
        return self.consumers.has_exclusive

    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.add(consumer)
        self._had_consumer = True
        self.touch()
        self.vhost.schedule_delivery(self)

    def remove_consumer(self, consumer: Consumer, *, notify: bool = False) -> None:
        """Detach a consumer; ``notify`` tells its channel (basic.cancel from the server)."""
        if not self.consumers.remove(consumer):
            return
        if notify:
            consumer.channel.consumer_cancelled(consumer)
        if not self.consumers:
            self.touch()
        elif self.settings.single_active_consumer and self.index.ready_count:
            self.vhost.schedule_delivery(self)  # the next consumer in line is now the active one
        if self.auto_delete and self._had_consumer and not self.consumers and not self.deleted:
            self.vhost.delete_queue(self.name)

    def delete(self) -> int:
        """Remove the queue's messages and files; consumers get basic.cancel."""
        count = self.index.ready_count
        self.deleted = True
        self.stop_timers()
        consumers, self.consumers = self.consumers, ConsumerSet()
        if consumers:
            # After the deleting channel's queue.delete-ok, as RabbitMQ: some clients (py-amqp)
            # treat a basic.cancel that arrives before that reply as an error of the delete.
            asyncio.get_running_loop().call_soon(_cancel_consumers, consumers)
        self.vhost.store.delete_queue(self.index)
        return count


def _cancel_consumers(consumers: ConsumerSet) -> None:
    for consumer in consumers:
        consumer.channel.consumer_cancelled(consumer)
