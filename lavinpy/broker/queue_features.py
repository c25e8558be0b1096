"""The slow paths of a classic queue: TTL, length limits, priorities, delivery limit, single active consumer.

Every classic queue holds one ``QueueFeatures``; the queue's hot paths (push, deliver, requeue in
``queue.py``) consult it only while ``Queue.special`` is True, which is when its settings (arguments
or policy) use one of these features or it received a message with an ``expiration``. A plain queue
pays one flag check per message.
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
    from .queue import Queue
    from .queue_consumer import QueueConsumer

log = logging.getLogger("lavinpy.queue")

EXPIRE_BATCH = 1024  # expired heads removed per timer callback before yielding to the loop


class QueueFeatures:
    """The feature state of one classic queue and the slow paths that use it."""

    def __init__(self, queue: Queue, settings: QueueSettings | None) -> None:
        self.queue = queue
        self.priority_index: PriorityIndex | None = None
        self.max_priority = 0
        self.track_bytes = False
        self.ready_bytes = 0
        self.has_limits = False
        self.has_ttl = False
        self._message_ttl_seen = False
        self._counts_deliveries = False
        # Requeued position -> times it was returned (x-delivery-limit queues only). The dict is the
        # store's, which keeps it on disk for durable queues; acked positions are popped here.
        self._delivery_counts_file = queue.vhost.store.open_delivery_counts(queue.index)
        self.delivery_counts: dict[int, int] = self._delivery_counts_file.counts
        self._ttl_timer = Timer(self._on_ttl_timer)
        self._expires_timer = Timer(self._on_expires_timer)
        self.apply(settings or QueueSettings())

    # --- settings -----------------------------------------------------------------------------
    def apply(self, settings: QueueSettings) -> None:
        """(Re)compute what the queue enforces; a policy change calls this at run time."""
        queue = self.queue
        queue.settings = settings
        index = queue.index
        self.priority_index = index if isinstance(index, PriorityIndex) else None
        self.max_priority = self.priority_index.max_priority if self.priority_index is not None else 0
        track_bytes = settings.max_length_bytes is not None
        if track_bytes and not self.track_bytes:
            self.ready_bytes = body_bytes(index, self._body_size)
        self.track_bytes = track_bytes
        self.has_limits = settings.max_length is not None or track_bytes
        self.has_ttl = settings.message_ttl is not None or self._message_ttl_seen
        self._counts_deliveries = settings.delivery_limit is not None
        if not self._counts_deliveries:
            self.delivery_counts.clear()
        queue.special = bool(self.has_ttl or self.has_limits or self._counts_deliveries
                             or settings.single_active_consumer or self.max_priority)
        if self.has_limits and settings.overflow == "drop-head":
            self._enforce_limits()
        if self.has_ttl:
            self._ttl_timer.arm_before(now_ms())  # look at the head now
        else:
            self._ttl_timer.cancel()
        self.touch()

    def enable_message_ttl(self) -> None:
        """A message with an expiration arrived: from now on this queue checks expiry."""
        if not self._message_ttl_seen:
            self._message_ttl_seen = True
            self.has_ttl = True
            self.queue.special = True

    def start_timers(self) -> None:
        if self.has_ttl:
            self._ttl_timer.arm_before(now_ms())
        self.touch()

    def stop_timers(self) -> None:
        self._ttl_timer.cancel()
        self._expires_timer.cancel()

    def _body_size(self, pos: int) -> int:
        msg = self.queue.read(pos)
        return len(msg.body) if msg is not None else 0

    # --- publishing ---------------------------------------------------------------------------
    def refuses(self, size: int) -> bool:
        settings = self.queue.settings
        return (self.has_limits and settings.overflow != "drop-head"
                and would_overflow(settings, self.queue.index.ready_count, self.ready_bytes, size))

    def index_push(self, pos: int, persistent: bool, message: StoredMessage) -> None:
        if self.priority_index is not None:
            self.priority_index.push(pos, persistent, message_priority(message.properties, self.max_priority))
        else:
            self.queue.index.push(pos, persistent)

    def push_ready(self, pos: int, persistent: bool, message: StoredMessage) -> None:
        """A message no consumer took at once becomes ready: expiry, byte count, limits."""
        queue = self.queue
        expiry = message_expiry(message.timestamp, message.properties, queue.settings.message_ttl) \
            if self.has_ttl else None
        if expiry is not None and expiry <= now_ms():
            # TTL 0 (or a clock step): expired unless a consumer took it at once, as in RabbitMQ.
            queue.vhost.dead_letter(queue, message, "expired")
            return
        self.index_push(pos, persistent, message)
        if self.track_bytes:
            self.ready_bytes += len(message.body)
        if self.has_limits and queue.settings.overflow == "drop-head":
            self._enforce_limits()
        if expiry is not None:
            self._ttl_timer.arm_before(expiry)
        if queue.consumers:
            queue.vhost.schedule_delivery(queue)

    def _enforce_limits(self) -> None:
        """drop-head: remove (and dead-letter, reason maxlen) head messages until within the limits."""
        queue = self.queue
        settings = queue.settings
        dlx = settings.dead_letter_exchange is not None
        while over_limit(settings, queue.index.ready_count, self.ready_bytes):
            shifted = queue.shift()
            if shifted is None:
                break
            pos = shifted[0]
            msg = queue.read(pos) if (dlx or self.track_bytes) else None
            if msg is not None:
                if self.track_bytes:
                    self.ready_bytes -= len(msg.body)
                if dlx:
                    queue.vhost.dead_letter(queue, msg, "maxlen")
            self.remove(pos)

    # --- delivering ---------------------------------------------------------------------------
    def pick_consumer(self) -> QueueConsumer | None:
        queue = self.queue
        if queue.settings.single_active_consumer:
            # Only the first registered consumer gets messages; the next takes over when it goes.
            active = queue.consumers.first()
            return active if active is not None and active.can_accept() else None
        return queue.consumers.next_ready()

    def take_ready(self) -> tuple[int, StoredMessage, bool] | None:
        """Shift the head, skipping (and removing) expired messages; the message comes back read."""
        queue = self.queue
        while True:
            shifted = queue.shift()
            if shifted is None:
                return None
            pos, redelivered = shifted
            msg = queue.read(pos)
            if msg is None:  # damaged: reported by read(); removed, the next one is tried
                self.remove(pos)
                continue
            if self.track_bytes:
                self.ready_bytes -= len(msg.body)
            if self.has_ttl:
                expiry = message_expiry(msg.timestamp, msg.properties, queue.settings.message_ttl)
                if expiry is not None and expiry <= now_ms():
                    self._expire(pos, msg)
                    continue
            if self.delivery_counts:
                count = self.delivery_counts.get(pos)
                if count:
                    msg = msg._replace(properties=delivery_count_properties(msg.properties, count))
            return pos, msg, redelivered

    def after_delivery(self) -> None:
        if self.has_ttl:
            self._arm_for_head()

    # --- settling -----------------------------------------------------------------------------
    def remove(self, pos: int) -> None:
        """An unacked position leaves the queue for good."""
        if self.delivery_counts:
            self.delivery_counts.pop(pos, None)
        self.queue.index.ack(pos)

    def purged(self) -> None:
        """After a purge only the unacked messages are left to count (the purged ones are gone)."""
        self.ready_bytes = 0
        counts = self.delivery_counts
        if counts:
            unacked = set(self.queue.index.unacked())
            for pos in [pos for pos in counts if pos not in unacked]:
                del counts[pos]

    def reject(self, pos: int) -> None:
        """basic.reject / basic.nack without requeue: dead-letter (reason rejected), then remove."""
        queue = self.queue
        if queue.settings.dead_letter_exchange is not None:
            msg = queue.read(pos)
            if msg is not None:
                queue.vhost.dead_letter(queue, msg, "rejected")
        self.remove(pos)

    def requeue(self, pos: int) -> None:
        queue = self.queue
        if self._counts_deliveries:
            count = self.delivery_counts.get(pos, 0) + 1
            limit = queue.settings.delivery_limit
            if limit is not None and count > limit:
                # Past the delivery limit: dead-lettered instead of requeued (quorum-queue semantics).
                if queue.settings.dead_letter_exchange is not None:
                    msg = queue.read(pos)
                    if msg is not None:
                        queue.vhost.dead_letter(queue, msg, "delivery_limit")
                self.remove(pos)
                return
            # On file before the message is ready again: a restart cannot hand it out with a lower count.
            self._delivery_counts_file.set(pos, count)
        queue.requeue_ready(pos)
        if self.track_bytes or self.has_ttl:
            msg = queue.read(pos)
            if msg is not None:
                if self.track_bytes:
                    self.ready_bytes += len(msg.body)
                if self.has_ttl:
                    expiry = message_expiry(msg.timestamp, msg.properties, queue.settings.message_ttl)
                    if expiry is not None:
                        self._ttl_timer.arm_before(expiry)

    # --- expiry -------------------------------------------------------------------------------
    def _expire(self, pos: int, msg: StoredMessage) -> None:
        self.queue.vhost.dead_letter(self.queue, msg, "expired")
        self.remove(pos)

    def _arm_for_head(self) -> None:
        """Arm the TTL timer for the head's expiry (only the head can expire)."""
        queue = self.queue
        while True:
            pos = queue.index.peek()
            if pos is None or queue.index.closed:
                return
            msg = queue.read(pos)
            if msg is not None:
                break
            queue.shift()  # a damaged head (reported by read()) leaves the queue
            self.remove(pos)
        expiry = message_expiry(msg.timestamp, msg.properties, queue.settings.message_ttl)
        if expiry is not None:
            self._ttl_timer.arm_before(expiry)

    def _on_ttl_timer(self) -> None:
        """Remove the expired messages at the head, then wait for the new head's expiry."""
        queue = self.queue
        if queue.deleted or queue.index.closed or not self.has_ttl:
            return
        now = now_ms()
        ttl = queue.settings.message_ttl
        index = queue.index
        for _ in range(EXPIRE_BATCH):
            pos = index.peek()
            if pos is None:
                return
            msg = queue.read(pos)
            if msg is None:  # damaged (reported by read()): it leaves the queue
                queue.shift()
                self.remove(pos)
                continue
            expiry = message_expiry(msg.timestamp, msg.properties, ttl)
            if expiry is None or expiry > now:
                if expiry is not None:
                    self._ttl_timer.arm_before(expiry)
                return
            queue.shift()
            if self.track_bytes:
                self.ready_bytes -= len(msg.body)
            self._expire(pos, msg)
        self._ttl_timer.arm_before(now)  # more may be due: continue on the next loop turn

    # --- x-expires ----------------------------------------------------------------------------
    def touch(self) -> None:
        """The queue was used (declared, consumed from, basic.get): restart its x-expires timer."""
        queue = self.queue
        expires = queue.settings.expires
        if expires is None or queue.deleted:
            self._expires_timer.cancel()
        elif queue.consumers:
            self._expires_timer.cancel()  # never expires while it has consumers
        else:
            self._expires_timer.reset(now_ms() + expires)

    def _on_expires_timer(self) -> None:
        queue = self.queue
        if not queue.deleted and not queue.consumers and queue.settings.expires is not None:
            log.info("queue %r in vhost %r expired (unused for %d ms)", queue.name, queue.vhost.name,
                     queue.settings.expires)
            queue.vhost.delete_queue(queue.name)
