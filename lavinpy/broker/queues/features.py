"""The slow paths of a classic queue: TTL, length limits, priorities, delivery limit, single active consumer.

Every classic queue holds one ``QueueFeatures``. While the queue's settings (arguments or policy) use
one of these features, or it received a message with an ``expiration``, the component's message paths
(push, deliver, get, settle, requeue, refuses) are bound on the queue in place of its plain ones
(``Queue.use_features``), and ``Queue.may_refuse`` tells the publish path to ask the queue first
(length limits). A plain queue's paths know nothing of features: it pays one flag check per published
message, nothing more. While the features in use need no step per message (priorities, a delivery
limit, retries: a quorum queue's defaults), runs of messages take the plain paths all the same
(``takes_runs``): a published run enters one priority level at once, deliveries and acks go as runs.
"""

from __future__ import annotations

import itertools
import logging
from array import array
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, cast

from ...store.delivery_counts import RetryDueTimes
from ...store.priority_index import PriorityIndex
from ...store.record import CorruptRecord, StoredMessage
from ..metrics.stats import MessageCounters
from ..settings.arguments import QueueSettings
from .base import DELIVERY_BATCH, QueueHost, QueueKind
from .death_headers import delivery_count_properties
from .length_limits import body_bytes, over_limit, would_overflow
from .priorities import message_priority
from .retry_hold import RetryHold
from .ttl import Timer, message_expiry, now_ms

if TYPE_CHECKING:
    from ...store.queue_index import QueueIndex
    from .consumer_set import ConsumerSet
    from .publish_run import PublishRun
    from .queue_consumer import QueueConsumer

log = logging.getLogger("lavinpy.queue")

EXPIRE_BATCH = 1024  # expired heads removed per timer callback before yielding to the loop


class ClassicQueue(Protocol):
    """The classic queue as its feature component uses it (``queue.Queue`` is one)."""

    name: str
    vhost: QueueHost
    settings: QueueSettings
    stats: MessageCounters
    special: bool
    may_refuse: bool
    deleted: bool
    _recovered_left: int  # recovered messages still to deliver with redelivered=true

    @property
    def index(self) -> QueueIndex: ...

    @property
    def consumers(self) -> ConsumerSet: ...

    def shift(self) -> tuple[int, bool] | None: ...

    def read(self, pos: int) -> StoredMessage | None: ...

    def requeue_ready(self, positions: list[int]) -> None: ...

    def use_features(self, features: QueueFeatures | None) -> None: ...

    def route_requeues(self, requeue_many: Callable[[list[int]], None]) -> None: ...

    def push_runs(self, positions: array, persistent: bool, run: PublishRun, first: int, level: int | None) -> None: ...

    def deliver_runs(self) -> bool: ...


class QueueFeatures:
    """The feature state of one classic queue and the slow paths that use it."""

    def __init__(self, queue: ClassicQueue, settings: QueueSettings | None) -> None:
        self.queue = queue
        self.priority_index: PriorityIndex | None = None
        self.max_priority = 0
        self.default_priority = 0
        self.track_bytes = False
        self.ready_bytes = 0
        self.has_limits = False
        self.has_ttl = False
        self._message_ttl_seen = False
        self._counts_deliveries = False
        self._lazy_retry = False
        # No feature in use needs a step per message on the way in or out (priorities, delivery
        # limit and retries alone: a quorum queue's defaults): runs take the queue's plain paths.
        self.takes_runs = False
        self.bound = False  # whether this component's message paths are the queue's (see _bind)
        # Requeued position -> times it was returned (x-delivery-limit queues only). The dict is the
        # store's, which keeps it on disk for durable queues; acked positions are popped here.
        self._delivery_counts_file = queue.vhost.store.open_delivery_counts(queue.index)
        self.delivery_counts: dict[int, int] = self._delivery_counts_file.counts
        # Messages waiting for a delayed retry (x-delayed-retry-*): unacked in the index, due times on file.
        self.retry = None if settings is None else settings.retry
        self.held = RetryHold(queue.vhost.store.open_delivery_counts(queue.index, RetryDueTimes), self._release)
        self.held_due = self.held.due  # its truth test is all a queue without held messages pays
        self.held_ready = set(self.held_due)  # recovered as ready after a restart: skipped when reached
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
        self.default_priority = settings.default_priority
        track_bytes = settings.max_length_bytes is not None
        if track_bytes and not self.track_bytes:
            self.ready_bytes = body_bytes(index, self._body_size)
        self.track_bytes = track_bytes
        self.has_limits = settings.max_length is not None or track_bytes
        self.has_ttl = settings.message_ttl is not None or self._message_ttl_seen
        self.takes_runs = not (self.has_ttl or self.has_limits or settings.single_active_consumer)
        # publishing asks the queue before it stores a message only while it may refuse one
        queue.may_refuse = self.has_limits and settings.overflow != "drop-head"
        self.retry = settings.retry
        self._counts_deliveries = settings.delivery_limit is not None or settings.retry is not None
        if not self._counts_deliveries:
            self.delivery_counts.clear()
        others = bool(self.has_ttl or self.has_limits or settings.delivery_limit is not None
                      or settings.single_active_consumer or self.max_priority)
        # Retries alone keep the plain paths until a message comes back (no cost without failures).
        self._lazy_retry = settings.retry is not None and not others
        self._bind(others or bool(self.held_due) or bool(self.delivery_counts))
        if self.has_limits and settings.overflow == "drop-head":
            self._enforce_limits()
        if self.has_ttl:
            self._ttl_timer.arm_before(now_ms())  # look at the head now
        else:
            self._ttl_timer.cancel()
        self.touch()

    def _bind(self, used: bool) -> None:
        """The queue's message paths: this component's, or the plain ones (whose requeues still
        come here while retries are on)."""
        queue = self.queue
        self.bound = used
        queue.use_features(self if used else None)
        if not used and self.retry is not None:
            queue.route_requeues(self.requeue_many)

    def enable_message_ttl(self) -> None:
        """A message with an expiration arrived: from now on this queue checks expiry."""
        if not self._message_ttl_seen:
            self._message_ttl_seen = True
            self._lazy_retry = False
            self.has_ttl = True
            self.takes_runs = False
            self.bound = True
            self.queue.use_features(self)

    def start_timers(self) -> None:
        self.held.start()
        if self.has_ttl:
            self._ttl_timer.arm_before(now_ms())
        self.touch()

    def stop_timers(self) -> None:
        self.held.stop()
        self._ttl_timer.cancel()
        self._expires_timer.cancel()

    def _body_size(self, pos: int) -> int:
        msg = self.queue.read(pos)
        return len(msg.body) if msg is not None else 0

    # --- publishing ---------------------------------------------------------------------------
    def push(self, pos: int, persistent: bool, message: StoredMessage | None = None) -> None:
        """``Queue.push`` while a feature is used: the record is needed (priority, TTL, bytes)."""
        queue = self.queue
        if message is None:
            message = queue.read(pos)
            if message is None:
                return
        index = queue.index
        if queue.consumers and not index.ready_count:
            # Nothing waiting: straight to a consumer with capacity, as the plain path does.
            consumer = self.pick_consumer()
            if consumer is not None:
                queue._recovered_left = 0
                if consumer.no_ack:
                    consumer.channel.deliver(consumer, pos, message, False)
                    return
                self.index_push(pos, persistent, message)
                index.shift()
                consumer.channel.deliver(consumer, pos, message, False)
                consumer.unacked += 1
                return
        self.push_ready(pos, persistent, message)

    def push_many(self, positions: array, persistent: bool, run: PublishRun, first: int) -> None:
        """``Queue.push_many`` while a feature is used: as a run when every message has the same level
        (or there are no priorities) and no feature looks at each message, else one by one."""
        if self.takes_runs:
            if self.priority_index is None:
                self.queue.push_runs(positions, persistent, run, first, None)
                return
            level = self._run_level(run, first, len(positions))
            if level is not None:
                self.queue.push_runs(positions, persistent, run, first, level)
                return
        push = self.push
        for i, pos in enumerate(positions):
            push(pos, persistent, run.message(first + i))

    def _run_level(self, run: PublishRun, first: int, count: int) -> int | None:
        """The priority level of every message of the run's slice, or None when they differ."""
        properties, top, default = run.properties, self.max_priority, self.default_priority
        if not isinstance(properties, list):
            return message_priority(properties, top, default)
        levels = {message_priority(block, top, default) for block in properties[first:first + count]}
        return levels.pop() if len(levels) == 1 else None

    def refuses(self, size: int) -> bool:
        settings = self.queue.settings
        return (self.has_limits and settings.overflow != "drop-head"
                and would_overflow(settings, self.queue.index.ready_count, self.ready_bytes, size))

    def index_push(self, pos: int, persistent: bool, message: StoredMessage) -> None:
        if self.priority_index is not None:
            self.priority_index.push(pos, persistent,
                                     message_priority(message.properties, self.max_priority, self.default_priority))
        else:
            self.queue.index.push(pos, persistent)

    def push_ready(self, pos: int, persistent: bool, message: StoredMessage) -> None:
        """A message no consumer took at once becomes ready: expiry, byte count, limits."""
        queue = self.queue
        expiry = message_expiry(message.timestamp, message.properties, queue.settings.message_ttl) \
            if self.has_ttl else None
        if expiry is not None and expiry <= now_ms():
            # TTL 0 (or a clock step): expired unless a consumer took it at once, as in RabbitMQ.
            self._dead_letter(message, "expired")
            return
        self.index_push(pos, persistent, message)
        if self.track_bytes:
            self.ready_bytes += len(message.body)
        if self.has_limits and queue.settings.overflow == "drop-head":
            self._enforce_limits()
        if expiry is not None:
            self._ttl_timer.arm_before(expiry)
        if queue.consumers:
            queue.vhost.schedule_delivery(cast(QueueKind, queue))

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
                    self._dead_letter(msg, "maxlen")
            self.remove(pos)

    # --- delivering ---------------------------------------------------------------------------
    def deliver(self) -> bool:
        """``Queue.deliver`` while a feature is used: one message at a time, expired heads skipped;
        as runs (the plain path, through the index's order) while nothing needs a step per message:
        no held message, no delivery count to put in a header."""
        queue = self.queue
        if self.takes_runs and not (self.delivery_counts or self.held_due or self.held_ready):
            return queue.deliver_runs()
        budget = DELIVERY_BATCH
        index = queue.index
        consumers = queue.consumers
        while budget and index.ready_count and consumers:
            consumer = self.pick_consumer()
            if consumer is None:
                break
            taken = self.take_ready()
            if taken is None:
                break
            pos, msg, redelivered = taken
            consumer.channel.deliver(consumer, pos, msg, redelivered)
            if not consumer.no_ack:
                consumer.unacked += 1
            else:
                self.remove(pos)
            budget -= 1
        self.after_delivery()
        return budget == 0

    def take_for_get(self) -> tuple[int, StoredMessage, bool] | None:
        """The head for basic.get (``Queue.get``'s step while a feature is used)."""
        taken = self.take_ready()
        self.after_delivery()
        return taken

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
            if self.held_ready and pos in self.held_ready:
                self.held_ready.discard(pos)  # held before a restart: unacked now, released when due
                continue
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
        if self.held_due:
            self.held.forget(pos)
            self.held_ready.discard(pos)
        self.queue.index.ack(pos)
        if self._lazy_retry and not self.delivery_counts and not self.held_due:
            self._bind(False)  # no returned message left: back to the plain paths

    def remove_many(self, positions: list[int]) -> None:
        if not (self.delivery_counts or self.held_due):  # nothing to forget: ``remove`` at once
            self.queue.index.ack_many(positions)
            if self._lazy_retry:
                self._bind(False)
            return
        remove = self.remove
        for pos in positions:
            remove(pos)

    def purged(self) -> int:
        """After a purge only the unacked messages are left to count (the purged ones are gone); the
        held ones go too (they are the queue's messages, only waiting): returns how many."""
        self.ready_bytes = 0
        held = 0
        if self.held_due:
            index = self.queue.index
            for pos in list(self.held_due):
                self.held.forget(pos)
                if pos not in self.held_ready and index.is_unacked(pos):
                    index.ack(pos)
                    held += 1
            self.held_ready.clear()
        counts = self.delivery_counts
        if counts:
            unacked = set(self.queue.index.unacked())
            for pos in [pos for pos in counts if pos not in unacked]:
                del counts[pos]
        return held

    def reject(self, pos: int) -> None:
        """basic.reject / basic.nack without requeue: dead-letter (reason rejected), then remove."""
        queue = self.queue
        if queue.settings.dead_letter_exchange is not None:
            msg = queue.read(pos)
            if msg is not None:
                self._dead_letter(msg, "rejected")
        self.remove(pos)

    def peek_held(self, count: int) -> list[tuple[StoredMessage, int]]:
        """The first ``count`` messages held for a delayed retry, with their due times (ms)."""
        out: list[tuple[StoredMessage, int]] = []
        read = self.queue.vhost.store.messages.read
        for pos, due in itertools.islice(self.held.items(), count):
            try:
                out.append((read(pos), due))
            except (CorruptRecord, KeyError):
                continue  # peeking changes nothing: the delivery path reports and removes it
        return out

    def requeue_many(self, positions: list[int]) -> None:
        """``requeue`` of each, in order (each may be counted, dead-lettered or held on its own)."""
        for pos in positions:
            self.requeue(pos)

    def requeue(self, pos: int, failed: bool = False) -> None:
        """A delivered message comes back (``failed``: basic.reject with requeue): counted, then
        dead-lettered past the delivery limit, held for a delayed retry, or ready again at once."""
        queue = self.queue
        count = 0
        if self._counts_deliveries:
            count = self.delivery_counts.get(pos, 0) + 1
            limit = queue.settings.delivery_limit
            if limit is not None and count > limit:
                # Past the delivery limit: dead-lettered instead of requeued (quorum-queue semantics).
                if queue.settings.dead_letter_exchange is not None:
                    msg = queue.read(pos)
                    if msg is not None:
                        self._dead_letter(msg, "delivery_limit")
                self.remove(pos)
                return
            # On file before the message is ready again: a restart cannot hand it out with a lower count.
            self._delivery_counts_file.set(pos, count)
        retry = self.retry
        if retry is not None and retry.applies(failed):
            delay = retry.delay(count)
            if delay > 0:
                self.held.hold(pos, now_ms() + delay)
                queue.stats.retried += 1
                if not self.bound:
                    self._bind(True)  # a counted message: its header and its ack need these paths
                return
        self._ready_again(pos)
        if not self.bound and self._counts_deliveries:
            self._bind(True)

    def _release(self, pos: int) -> None:
        """A held message is due: ready again at the head (after a restart it may be there already)."""
        queue = self.queue
        if pos in self.held_ready:
            self.held_ready.discard(pos)
            return
        if queue.deleted or not queue.index.is_unacked(pos):
            return
        self._ready_again(pos)
        if queue.consumers:
            queue.vhost.schedule_delivery(cast(QueueKind, queue))

    def _ready_again(self, pos: int) -> None:
        queue = self.queue
        queue.requeue_ready([pos])
        if self.track_bytes or self.has_ttl:
            msg = queue.read(pos)
            if msg is not None:
                if self.track_bytes:
                    self.ready_bytes += len(msg.body)
                if self.has_ttl:
                    expiry = message_expiry(msg.timestamp, msg.properties, queue.settings.message_ttl)
                    if expiry is not None:
                        self._ttl_timer.arm_before(expiry)

    def _dead_letter(self, msg: StoredMessage, reason: str) -> None:
        self.queue.vhost.dead_letter(cast(QueueKind, self.queue), msg, reason)  # the queue is a QueueKind

    # --- expiry -------------------------------------------------------------------------------
    def _expire(self, pos: int, msg: StoredMessage) -> None:
        self._dead_letter(msg, "expired")
        self.remove(pos)

    def _arm_for_head(self) -> None:
        """Arm the TTL timer for the head's expiry (only the head can expire)."""
        queue = self.queue
        while True:
            pos = queue.index.peek()
            if pos is None:
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
        if queue.deleted or not self.has_ttl:
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
