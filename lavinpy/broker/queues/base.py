"""The queue-kind contract: everything the vhost and the channels may ask of a queue.

Classic (``queue.Queue``, with or without priorities) and stream (``stream.StreamQueue``) queues
implement it; the vhost holds them as ``dict[str, QueueKind]`` and never asks which kind a queue is.
Where the kinds differ, the difference is a method here: a stream's ``reject`` is credit only, a
classic queue's ``validate_consumer`` accepts everything, only a stream's ``apply_retention`` drops
messages, and so on. The defaults below are what a kind without that feature does.

Monitoring (the HTTP API, the metrics, the dashboard) reads a queue only through ``kind``, ``stats``
and the "state" section (``message_count``, ``unacked_count``, ``consumer_count``,
``head_timestamp_ms``, ``head_message``, ``peek``, ``persistent_count``, ``memory_bytes``), never
through its index: the figures a kind must give itself are abstract here, so a kind that lacks one
cannot be instantiated, rather than failing a scrape later.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from array import array
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from ...store.record import CorruptRecord, StoredMessage
from ...wire.position import pos_offset, pos_segment
from ..settings.arguments import QueueSettings

if TYPE_CHECKING:
    from ...store.index_kinds import AnyIndex
    from ...store.vhost_store import VhostStore
    from ..metrics.stats import MessageCounters, NodeCounters
    from .dedup_cache import DedupCache
    from .publish_run import PublishRun
    from .queue_consumer import QueueConsumer


log = logging.getLogger("lavinpy.queue")

# Deliveries a queue makes in one go before other queues get a turn on the event loop.
DELIVERY_BATCH = 256
# What a delivery in a run (a consumer's share of a go, booked and framed in one call) costs of a go's
# budget: a RUN_SHARE-th of one delivered alone. At a whole one, a go of small messages was mostly the
# go's own fixed cost: with runs eight times as long, the broker's CPU a message fell by about a third
# for a stream read by one consumer and by two fifths for a queue read by two (bench/history.md).
RUN_SHARE = 8
# A delivery run's bodies stay near this many bytes: the channel's output high-water mark is checked
# once per run, so a run of large messages must be short (the first run of a queue is FIRST_RUN long).
RUN_BYTES = 1 << 20
FIRST_RUN = 16


def run_cost(delivered: int) -> int:
    """What ``delivered`` deliveries in runs cost of a go's budget (a part counts whole)."""
    return -(-delivered // RUN_SHARE)


class QueueHost(Protocol):
    """What a queue needs of the vhost that holds it, and nothing more (``vhost.VHost`` is one)."""

    name: str
    corrupt_messages: int  # damaged records found by the host's queues
    # Delivery books (channels) of this vhost with a channel-wide prefetch now: while there are none,
    # no channel limits a delivery run (Deliveries.set_prefetch keeps it).
    channel_wide_prefetches: int

    @property
    def store(self) -> VhostStore: ...

    @property
    def node_counters(self) -> NodeCounters: ...

    def schedule_delivery(self, queue: QueueKind) -> None:
        """The queue has messages and consumers with capacity: deliver on the next loop turn."""

    def dead_letter(self, queue: QueueKind, msg: StoredMessage, reason: str) -> int:
        """Route ``msg`` leaving ``queue`` to its dead-letter exchange; returns queues reached."""
        ...

    def delete_queue(self, name: str) -> int:
        """Delete the queue (x-expires, auto-delete)."""
        ...


class QueueKind(ABC):
    """A queue as the vhost and channels see it; each kind brings its index, delivery and acks."""

    name: str
    vhost: QueueHost
    index: AnyIndex
    arguments: dict[str, Any]
    settings: QueueSettings
    durable: bool
    exclusive: bool
    exclusive_owner: object | None
    auto_delete: bool
    deleted: bool
    consumers: Collection[QueueConsumer]
    kind: str  # RabbitMQ's queue "type" as the API reports it: "classic" (priorities included), "quorum", "stream"
    stats: MessageCounters
    # True while the queue's feature component handles its messages (TTL, limits, priorities...).
    special = False
    # True while a message may be refused (length limits that reject): publishing asks the queue
    # before it stores one; the one flag the publish hot path reads.
    may_refuse = False
    dedup: DedupCache | None = None  # message deduplication (x-message-deduplication), classic and quorum
    corrupt_messages = 0  # damaged records found (and skipped) in this queue

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} vhost={self.vhost.name!r}>"

    # --- state --------------------------------------------------------------------------------
    @property
    @abstractmethod
    def message_count(self) -> int:
        """Messages ready for delivery (queue.declare-ok, basic.get-ok)."""

    @property
    @abstractmethod
    def unacked_count(self) -> int:
        """Deliveries waiting for a settlement that would remove them from the queue."""

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    def head_position(self) -> int | None:
        """Where the message delivered next is stored; None when there is none, or no single next
        message for the kind (this default: a stream, whose consumers each read from their own offset)."""
        return None

    def head_message(self) -> StoredMessage | None:
        """The head message (``head_position``) as stored, or None."""
        pos = self.head_position() if self.message_count else None
        if pos is None:
            return None
        try:
            return self.vhost.store.messages.read(pos)
        except (CorruptRecord, KeyError):
            return None  # a statistics read reports nothing: the delivery path reports and skips it

    def head_timestamp_ms(self) -> int | None:
        """When the head message (``head_position``) was published (ms), or None."""
        head = self.head_message()
        return head.timestamp if head is not None else None

    def persistent_count(self) -> int | None:
        """Messages that survive a restart (RabbitMQ's messages_persistent), or None: this default is a
        kind that keeps no such count."""
        return None

    def memory_bytes(self) -> int | None:
        """Bytes the queue holds in memory (bodies live in the shared segment files), or None: this
        default is a kind that does not measure it."""
        return None

    @abstractmethod
    def peek(self, count: int) -> list[tuple[StoredMessage, bool]]:
        """Up to ``count`` messages from the head as a consumer would get them, with their redelivered
        flag; nothing is taken, marked or reported (a damaged record is left out)."""

    def is_unused(self) -> bool:
        return not self.consumers

    def has_exclusive_consumer(self) -> bool:
        return any(c.exclusive for c in self.consumers)

    def redelivered_positions(self) -> list[int]:
        """Ready positions already delivered once (saved at a clean stop for their redelivered flag)."""
        return []

    def mark_redelivered(self, positions: Iterable[int]) -> None:
        """Recovered ready positions that must go out with redelivered=true."""
        return None

    # --- messages in --------------------------------------------------------------------------
    @abstractmethod
    def push(self, pos: int, persistent: bool, message: StoredMessage | None = None) -> None:
        """A stored message was routed here; ``message`` is the record in hand, if the caller has it."""

    def push_many(self, positions: array, persistent: bool, run: PublishRun, first: int) -> None:
        """A run of stored messages was routed here: ``positions[i]`` holds ``run.message(first + i)``.

        This default pushes them one by one; a classic queue without features does better.
        """
        for i, pos in enumerate(positions):
            self.push(pos, persistent, run.message(first + i))

    def refuses(self, size: int) -> bool:
        """Whether a message of ``size`` bytes is refused now (reject-publish overflow)."""
        return False

    def enable_message_ttl(self) -> None:
        """A message with an ``expiration`` is about to be pushed."""
        return None

    # --- messages out -------------------------------------------------------------------------
    @abstractmethod
    def deliver(self) -> bool:
        """Deliver to consumers with capacity, up to DELIVERY_BATCH; True if more could go out now."""

    @abstractmethod
    def get(self) -> tuple[int, StoredMessage, bool] | None:
        """basic.get: (position, message, redelivered) now unacked, or None when empty."""

    @abstractmethod
    def ack(self, pos: int) -> None:
        """A delivered message was acknowledged."""

    def ack_many(self, positions: list[int]) -> None:
        """``ack`` for several deliveries of this queue (basic.ack multiple=true)."""
        for pos in positions:
            self.ack(pos)

    @abstractmethod
    def requeue(self, pos: int) -> None:
        """A delivered message comes back (nack/reject with requeue, closed channel)."""

    def requeue_many(self, positions: list[int]) -> None:
        """``requeue`` for several deliveries of this queue (a closing channel's), in delivery order."""
        for pos in positions:
            self.requeue(pos)

    @property
    def delayed_count(self) -> int:
        """Messages held for a delayed retry (a queue kind without retries holds none)."""
        return 0

    def peek_delayed(self, count: int) -> list[tuple[StoredMessage, int]]:
        """The first ``count`` held messages with their due times (ms), earliest first."""
        return []

    def requeue_failed(self, pos: int) -> None:
        """basic.reject with requeue: processing failed (RabbitMQ 4.3's reading); else as ``requeue``."""
        self.requeue(pos)

    @abstractmethod
    def reject(self, pos: int) -> None:
        """A delivered message was refused without requeue."""

    @abstractmethod
    def purge(self) -> int:
        """queue.purge: remove the ready messages; returns how many."""

    # --- consumers ----------------------------------------------------------------------------
    def validate_consumer(self, no_ack: bool, prefetch: int, arguments: dict[str, Any] | None,
                          global_prefetch: int = 0) -> None:
        """Refuse a basic.consume this kind does not support (raises the AMQP error)."""
        return None

    @abstractmethod
    def add_consumer(self, consumer: QueueConsumer) -> None: ...

    @abstractmethod
    def remove_consumer(self, consumer: QueueConsumer, *, notify: bool = False) -> None:
        """Detach a consumer; ``notify`` tells its channel (basic.cancel from the server)."""

    # --- life cycle ---------------------------------------------------------------------------
    @abstractmethod
    def delete(self) -> int:
        """Remove the queue's messages and files; consumers get basic.cancel. Returns messages dropped."""

    def touch(self) -> None:
        """The queue was used (declared again, consumed from, basic.get): x-expires starts over."""
        return None

    def apply_settings(self, settings: QueueSettings) -> None:
        """A policy changed: enforce ``settings`` from now on."""
        return None

    def start_timers(self) -> None:
        """The event loop runs: arm the queue's timers."""
        return None

    def write_state(self, sync: bool = False) -> None:
        """Write now what the periodic task otherwise writes besides the store (a stream's tracked
        consumer offsets and filter-value tags); ``sync``: fsynced too."""
        return None

    def stop_timers(self) -> None:
        """The vhost is closing: no timer may touch the store after it is closed, so what the periodic
        task writes is written a last time, synced."""
        self.write_state(sync=True)

    def apply_retention(self) -> int:
        """Periodic retention (x-max-age of an idle stream); returns messages dropped."""
        return 0

    # --- reading records ----------------------------------------------------------------------
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
        if self.settings.dead_letter_exchange is None:
            return
        salvaged = self.vhost.store.messages.salvage(pos)
        if salvaged is not None:
            self.vhost.dead_letter(self, salvaged, "corrupt")
