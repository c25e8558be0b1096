"""The slow paths of a queue: TTL, length limits, priorities, delivery limit, single active consumer.

A plain queue never enters this module: ``Queue.special`` is False and its push, delivery and requeue
stay the short hot paths in ``queue.py``. A queue whose settings (arguments or policy) use one of
these features, or that received a message with an ``expiration``, takes these paths instead.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..store.priority_index import PriorityIndex
from ..store.record import StoredMessage
from .arguments import QueueSettings
from .death_headers import delivery_count_properties
from .limits import body_bytes, over_limit, would_overflow
from .priorities import message_priority
from .ttl import Timer, message_expiry, now_ms

if TYPE_CHECKING:
    from .consumer import Consumer
    from .queue import Queue

log = logging.getLogger("lavinpy.queue")

DELIVERY_BATCH = 256
EXPIRE_BATCH = 1024  # expired heads removed per timer callback before yielding to the loop


class QueueFeatures:
    """Mixed into ``Queue``; every method here assumes ``self`` is a Queue."""

    # --- settings -----------------------------------------------------------------------------
    def apply_settings(self: Queue, settings: QueueSettings) -> None:
        """(Re)compute what the queue enforces; a policy change calls this at run time."""
        self.settings = settings
        max_priority = self.index.max_priority if isinstance(self.index, PriorityIndex) else 0
        self._max_priority = max_priority
        track_bytes = settings.max_length_bytes is not None
        if track_bytes and not self._track_bytes:
            self._ready_bytes = body_bytes(self.index, self._body_size)
        self._track_bytes = track_bytes
        self._has_limits = settings.max_length is not None or track_bytes
        self._has_ttl = settings.message_ttl is not None or self._message_ttl_seen
        self._counts_deliveries = settings.delivery_limit is not None
        if not self._counts_deliveries:
            self._delivery_counts.clear()
        self.special = bool(self._has_ttl or self._has_limits or self._counts_deliveries
                            or settings.single_active_consumer or max_priority)
        if self._has_limits and settings.overflow == "drop-head":
            self._enforce_limits()
        if self._has_ttl:
            self._ttl_timer.arm_before(now_ms())  # look at the head now
        else:
            self._ttl_timer.cancel()
        self.touch()

    def enable_message_ttl(self: Queue) -> None:
        """A message with an expiration arrived: from now on this queue checks expiry."""
        if not self._message_ttl_seen:
            self._message_ttl_seen = True
            self._has_ttl = True
            self.special = True

    def start_timers(self: Queue) -> None:
        """Arm the timers once the event loop runs (queues are opened before it serves)."""
        if self._has_ttl:
            self._ttl_timer.arm_before(now_ms())
        self.touch()

    def stop_timers(self: Queue) -> None:
        """The vhost is closing: no timer may touch the store after it is closed."""
        self._ttl_timer.cancel()
        self._expires_timer.cancel()

    def _body_size(self: Queue, pos: int) -> int:
        msg = self.read(pos)
        return len(msg.body) if msg is not None else 0

    # --- publishing ---------------------------------------------------------------------------
    def refuses(self: Queue, size: int) -> bool:
        """reject-publish / reject-publish-dlx: whether a message of ``size`` bytes is refused now."""
        settings = self.settings
        return (self._has_limits and settings.overflow != "drop-head"
                and would_overflow(settings, self.index.ready_count, self._ready_bytes, size))

    def _index_push(self: Queue, pos: int, persistent: bool, message: StoredMessage) -> None:
        if self._max_priority:
            self.index.push(pos, persistent, message_priority(message.properties, self._max_priority))  # type: ignore[call-arg]
        else:
            self.index.push(pos, persistent)

    def _push_special(self: Queue, pos: int, persistent: bool, message: StoredMessage | None) -> None:
        if message is None:
            message = self.read(pos)
            if message is None:
                return
        index = self.index
        if self.consumers and not index.ready_count:
            consumer = self._pick_consumer()
            if consumer is not None:  # nothing waiting: straight to the consumer, as the hot path
                self._recovered_left = 0
                if consumer.no_ack:
                    consumer.channel.deliver(consumer, pos, message, False)
                    return
                self._index_push(pos, persistent, message)
                index.shift()
                consumer.channel.deliver(consumer, pos, message, False)
                consumer.unacked += 1
                return
        expiry = message_expiry(message.timestamp, message.properties, self.settings.message_ttl) \
            if self._has_ttl else None
        if expiry is not None and expiry <= now_ms():
            # TTL 0 (or a clock step): expired unless a consumer took it at once, as in RabbitMQ.
            self.vhost.dead_letter(self, message, "expired")
            return
        self._index_push(pos, persistent, message)
        if self._track_bytes:
            self._ready_bytes += len(message.body)
        if self._has_limits and self.settings.overflow == "drop-head":
            self._enforce_limits()
        if expiry is not None:
            self._ttl_timer.arm_before(expiry)
        if self.consumers:
            self.vhost.schedule_delivery(self)

    def _enforce_limits(self: Queue) -> None:
        """drop-head: remove (and dead-letter, reason maxlen) head messages until within the limits."""
        settings = self.settings
        dlx = settings.dead_letter_exchange is not None
        while over_limit(settings, self.index.ready_count, self._ready_bytes):
            shifted = self._shift()
            if shifted is None:
                break
            pos = shifted[0]
            msg = self.read(pos) if (dlx or self._track_bytes) else None
            if msg is not None:
                if self._track_bytes:
                    self._ready_bytes -= len(msg.body)
                if dlx:
                    self.vhost.dead_letter(self, msg, "maxlen")
            self._remove(pos)

    # --- delivering ---------------------------------------------------------------------------
    def _pick_consumer(self: Queue) -> Consumer | None:
        if self.settings.single_active_consumer:
            # Only the first registered consumer gets messages; the next takes over when it goes.
            active = self.consumers.first()
            return active if active is not None and active.can_accept() else None
        return self._next_consumer()

    def _take_ready(self: Queue) -> tuple[int, StoredMessage, bool] | None:
        """Shift the head, skipping (and removing) expired messages; the message comes back read."""
        while True:
            shifted = self._shift()
            if shifted is None:
                return None
            pos, redelivered = shifted
            msg = self.read(pos)
            if msg is None:  # damaged: reported by read(); removed, the next one is tried
                self._remove(pos)
                continue
            if self._track_bytes:
                self._ready_bytes -= len(msg.body)
            if self._has_ttl:
                expiry = message_expiry(msg.timestamp, msg.properties, self.settings.message_ttl)
                if expiry is not None and expiry <= now_ms():
                    self._expire(pos, msg)
                    continue
            if self._delivery_counts:
                count = self._delivery_counts.get(pos)
                if count:
                    msg = msg._replace(properties=delivery_count_properties(msg.properties, count))
            return pos, msg, redelivered

    def _deliver_special(self: Queue) -> bool:
        budget = DELIVERY_BATCH
        index = self.index
        while budget and index.ready_count and self.consumers and not index.closed:
            consumer = self._pick_consumer()
            if consumer is None:
                break
            taken = self._take_ready()
            if taken is None:
                break
            pos, msg, redelivered = taken
            consumer.channel.deliver(consumer, pos, msg, redelivered)
            if consumer.no_ack:
                self._remove(pos)
            else:
                consumer.unacked += 1
            budget -= 1
        if self._has_ttl:
            self._arm_for_head()
        return budget == 0

    def _get_special(self: Queue) -> tuple[int, StoredMessage, bool] | None:
        taken = self._take_ready()
        if self._has_ttl:
            self._arm_for_head()
        return taken

    # --- settling -----------------------------------------------------------------------------
    def _remove(self: Queue, pos: int) -> None:
        """An unacked position leaves the queue for good."""
        if self._delivery_counts:
            self._delivery_counts.pop(pos, None)
        self.index.ack(pos)

    def forget_purged_counts(self: Queue) -> None:
        """After a purge only the unacked messages are left to count (the purged ones are gone)."""
        counts = self._delivery_counts
        unacked = set(self.index.unacked())
        for pos in [pos for pos in counts if pos not in unacked]:
            del counts[pos]

    def reject(self: Queue, pos: int) -> None:
        """basic.reject / basic.nack without requeue: dead-letter (reason rejected), then remove."""
        if self.deleted:
            return
        if self.settings.dead_letter_exchange is not None:
            msg = self.read(pos)
            if msg is not None:
                self.vhost.dead_letter(self, msg, "rejected")
        self._remove(pos)

    def _requeue_special(self: Queue, pos: int) -> None:
        msg = None
        if self._counts_deliveries:
            count = self._delivery_counts.get(pos, 0) + 1
            limit = self.settings.delivery_limit
            if limit is not None and count > limit:
                # Past the delivery limit: dead-lettered instead of requeued (quorum-queue semantics).
                if self.settings.dead_letter_exchange is not None:
                    msg = self.read(pos)
                    if msg is not None:
                        self.vhost.dead_letter(self, msg, "delivery_limit")
                self._remove(pos)
                return
            # On file before the message is ready again: a restart cannot hand it out with a lower count.
            self._delivery_counts_file.set(pos, count)
        self.index.requeue(pos)
        self._redelivered.add(pos)
        if self._track_bytes or self._has_ttl:
            msg = self.read(pos)
            if msg is not None:
                if self._track_bytes:
                    self._ready_bytes += len(msg.body)
                if self._has_ttl:
                    expiry = message_expiry(msg.timestamp, msg.properties, self.settings.message_ttl)
                    if expiry is not None:
                        self._ttl_timer.arm_before(expiry)
        if self.consumers:
            self.vhost.schedule_delivery(self)

    # --- expiry -------------------------------------------------------------------------------
    def _expire(self: Queue, pos: int, msg: StoredMessage) -> None:
        self.vhost.dead_letter(self, msg, "expired")
        self._remove(pos)

    def _arm_for_head(self: Queue) -> None:
        """Arm the TTL timer for the head's expiry (only the head can expire)."""
        while True:
            pos = self.index.peek()
            if pos is None or self.index.closed:
                return
            msg = self.read(pos)
            if msg is not None:
                break
            self._shift()  # a damaged head (reported by read()) leaves the queue
            self._remove(pos)
        expiry = message_expiry(msg.timestamp, msg.properties, self.settings.message_ttl)
        if expiry is not None:
            self._ttl_timer.arm_before(expiry)

    def _on_ttl_timer(self: Queue) -> None:
        """Remove the expired messages at the head, then wait for the new head's expiry."""
        if self.deleted or self.index.closed or not self._has_ttl:
            return
        now = now_ms()
        ttl = self.settings.message_ttl
        index = self.index
        for _ in range(EXPIRE_BATCH):
            pos = index.peek()
            if pos is None:
                return
            msg = self.read(pos)
            if msg is None:  # damaged (reported by read()): it leaves the queue
                self._shift()
                self._remove(pos)
                continue
            expiry = message_expiry(msg.timestamp, msg.properties, ttl)
            if expiry is None or expiry > now:
                if expiry is not None:
                    self._ttl_timer.arm_before(expiry)
                return
            self._shift()
            if self._track_bytes:
                self._ready_bytes -= len(msg.body)
            self._expire(pos, msg)
        self._ttl_timer.arm_before(now)  # more may be due: continue on the next loop turn

    # --- x-expires ----------------------------------------------------------------------------
    def touch(self: Queue) -> None:
        """The queue was used (declared, consumed from, basic.get): restart its x-expires timer."""
        expires = self.settings.expires
        if expires is None or self.deleted:
            self._expires_timer.cancel()
        elif self.consumers:
            self._expires_timer.cancel()  # never expires while it has consumers
        else:
            self._expires_timer.reset(now_ms() + expires)

    def _on_expires_timer(self: Queue) -> None:
        if not self.deleted and not self.consumers and self.settings.expires is not None:
            log.info("queue %r in vhost %r expired (unused for %d ms)", self.name, self.vhost.name,
                     self.settings.expires)
            self.vhost.delete_queue(self.name)

    def init_features(self: Queue, settings: QueueSettings | None) -> None:
        self.special = False
        self._max_priority = 0
        self._track_bytes = False
        self._ready_bytes = 0
        self._has_limits = False
        self._has_ttl = False
        self._message_ttl_seen = False
        self._counts_deliveries = False
        # Requeued position -> times it was returned (x-delivery-limit queues only). The dict is the
        # store's, which keeps it on disk for durable queues; the broker pops acked positions itself.
        self._delivery_counts_file = self.vhost.store.open_delivery_counts(self.index)
        self._delivery_counts: dict[int, int] = self._delivery_counts_file.counts
        self._ttl_timer = Timer(self._on_ttl_timer)
        self._expires_timer = Timer(self._on_expires_timer)
        self.apply_settings(settings or QueueSettings())
