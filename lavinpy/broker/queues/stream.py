"""A stream queue (``x-queue-type: stream``): an append-only log that consumers read without removing.

RabbitMQ's stream semantics for AMQP 0-9-1 clients, with LavinMQ's offsets (the first is 1):

- Durable only, not exclusive or auto-delete; ``x-max-length-bytes``/``x-max-age`` drop head segments.
- Each consumer's cursor comes from its ``x-stream-offset``: ``first``, ``last`` (the newest message),
  ``next`` (default: only new ones), an offset, ``-N`` (the last N, LavinMQ's), a timestamp (seconds:
  the first stored at or after it) or an interval (``1h`` ago). Every delivery carries an
  ``x-stream-offset`` header (a signed 64-bit ``long``) and ``redelivered = false``.
- A consumer needs a prefetch (basic.qos, else 406) and manual acks (no-ack, global qos: 540); an ack,
  nack or reject is only credit. basic.get and queue.purge: 540 NOT_IMPLEMENTED, as RabbitMQ's.

Retention by size and age runs when the stream opens and when its tail moves to a new segment (as
RabbitMQ's on roll-over); the vhost's periodic ``apply_retention()`` applies ``x-max-age`` alone.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import TYPE_CHECKING, Any

from ...store.record import CorruptRecord, StoredMessage
from ...store.stamped_frames import FRAMES_COMPILED, segment_frames
from ...wire.position import pos_segment
from ...wire.properties import peek_headers
from ..errors import NOT_IMPLEMENTED, BrokerConnectionError
from ..metrics.stats import MessageCounters
from ..settings.arguments import QueueSettings
from .base import DELIVERY_BATCH, FIRST_RUN, RUN_BYTES, RUN_SHARE, QueueHost, QueueKind, run_cost
from .stream_arguments import OFFSET_HEADER, parse_stream_offset, queue_in_vhost, validate_stream_consumer
from .stream_filter import StreamFilter, stream_filter
from .stream_offsets import OffsetTracker, tracking_requested
from .stream_stamps import _SPLICES, stamped_run, with_stream_offset
from .stream_tags import UNKNOWN, UNTAGGED, VALUE_KEY, FilterTags, TagsFile

if TYPE_CHECKING:
    from array import array

    from ...store.stream_index import StreamIndex
    from .publish_run import PublishRun
    from .queue_consumer import QueueConsumer

log = logging.getLogger("lavinpy.stream")

REBUILD_BATCH = 20_000  # recovered offsets classified per periodic turn (stream_tags): about 15 ms
SCAN_WINDOW = 1 << 20  # tags searched per step of a filtering consumer's delivery


# method ids for error replies
_BASIC_GET = (60, 70)
_QUEUE_PURGE = (50, 30)

# --- the queue ---------------------------------------------------------------------------------

class StreamQueue(QueueKind):
    """The ``x-queue-type: stream`` kind of queue."""

    kind = "stream"
    durable = True
    exclusive = False
    exclusive_owner = None
    auto_delete = False

    def __init__(self, vhost: QueueHost, name: str, index: StreamIndex, *,
                 arguments: dict[str, Any] | None = None) -> None:
        self.vhost = vhost
        self.name = name
        self.index: StreamIndex = index
        self.arguments = arguments or {}
        # Arguments only: RabbitMQ streams take retention from their declaration here.
        self.settings = QueueSettings.resolve(self.arguments)
        self.consumers: list[QueueConsumer] = []
        self.stats = MessageCounters()
        self.deleted = False
        self._cursors: dict[QueueConsumer, int] = {}  # consumer -> next offset to deliver to it
        self._filters: dict[QueueConsumer, StreamFilter] = {}  # the consumers that filter (stream_filter)
        # Resumed consumers: the offsets ahead they had settled already (not delivered again).
        self._skips: dict[QueueConsumer, set[int]] = {}
        self.offsets = OffsetTracker(index.directory, name)  # named consumers' offsets (stream_offsets)
        self.tags = FilterTags(index.first_offset, index.count)  # each offset's filter values (stream_tags)
        self.tags_file = TagsFile(index.directory)  # ... kept beside the entries: read, not rebuilt
        self.tags_file.load(self.tags, index.first_offset, index.first_offset + index.count)
        self._damaged: set[int] = set()  # positions of damaged records already reported
        self._rr = 0
        self._run_limit = FIRST_RUN  # messages per delivery run, from the body sizes seen last
        # Validated at declaration; a bad value in old definitions resolves to None (no limit).
        self.max_length_bytes = self.settings.max_length_bytes
        self.max_age_ms = self.settings.max_age
        self._tail_segment = self._last_segment()
        self._trim(by_size=True)

    # --- state --------------------------------------------------------------------------------
    @property
    def message_count(self) -> int:
        return self.index.count

    @property
    def unacked_count(self) -> int:
        """Always 0, as RabbitMQ reports a stream's: a settlement only returns credit, nothing leaves."""
        return 0

    def peek(self, count: int) -> list[tuple[StoredMessage, bool]]:
        """The oldest messages kept (what a consumer from ``first`` gets), stamped with their offsets."""
        offset = self.index.first_offset
        positions = self.index.get_many(offset, count)
        read = self.vhost.store.messages.read
        out: list[tuple[StoredMessage, bool]] = []
        for i, pos in enumerate(positions):
            if not pos:
                continue  # a hole left by a damaged record
            try:
                msg = read(pos)
            except (CorruptRecord, KeyError):
                continue
            out.append((StoredMessage(msg.timestamp, msg.exchange, msg.routing_key,
                                      with_stream_offset(msg.properties, offset + i), msg.body), False))
        return out

    def offset_of(self, consumer: QueueConsumer) -> int | None:
        """The next offset ``consumer`` will get (None if it is not a consumer of this stream)."""
        return self._cursors.get(consumer)

    def _where(self) -> str:
        return queue_in_vhost(self.name, self.vhost.name)

    # --- retention ----------------------------------------------------------------------------
    def _last_segment(self) -> int:
        pos = self.index.get(self.index.last_offset)
        return 0 if pos is None else pos_segment(pos)

    def apply_retention(self, now_ms: int | None = None) -> int:
        """Periodic retention: drop whole segments older than x-max-age; returns messages dropped. The
        tracked consumer offsets and the new filter-value tags are written too."""
        if self.tags.rebuilding:
            self.rebuild_tags()
        self.write_state()
        return self._trim(by_size=False, now_ms=now_ms)

    def rebuild_tags(self, limit: int = REBUILD_BATCH) -> None:
        """Classify up to ``limit`` recovered offsets from their records (bounded: the loop goes on)."""
        self.tags.rebuild(self.index, self.vhost.store.messages.read_many, limit)

    def write_state(self, sync: bool = False) -> None:
        """The tracked consumer offsets and the filter-value tags not yet on file are written."""
        self.offsets.flush()
        if not self.deleted:
            self.tags_file.save(self.tags, sync=sync)

    def _trim(self, by_size: bool, now_ms: int | None = None) -> int:
        """Drop whole segments from the head per x-max-length-bytes (when ``by_size``) and x-max-age."""
        max_bytes = self.max_length_bytes if by_size else None
        if max_bytes is None and self.max_age_ms is None:
            return 0
        if self.deleted:
            return 0
        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        dropped = self.index.trim(max_bytes, self.max_age_ms, now)
        self.tags.trim(self.index.first_offset)
        if dropped:
            log.debug("stream %r: retention dropped %d messages; first offset is now %d",
                      self.name, dropped, self.index.first_offset)
        return dropped

    # --- messages in --------------------------------------------------------------------------
    def push(self, pos: int, persistent: bool = True, message: StoredMessage | None = None) -> None:
        """Append a message. Every stream entry is persisted, whatever its delivery mode: offsets
        must be the same after a restart."""
        offset = self.index.append(pos)
        # (inline for the common message without the header: a search of its block, a byte appended)
        tag = UNKNOWN if message is None else UNTAGGED if VALUE_KEY not in message.properties else \
            self.tags.tag_of(message.properties)
        self.tags.tags.append(tag)
        segment = pos_segment(pos)
        if segment != self._tail_segment:
            self._tail_segment = segment
            self._trim(by_size=True)
        if not self.consumers:
            return
        behind = False
        filters = self._filters
        for consumer in self.consumers:
            cursor = self._cursors[consumer]
            if self._skips and consumer in self._skips:
                behind = True
                continue
            wanted = filters.get(consumer) if filters else None
            if wanted is not None and cursor == offset:
                match = self.tags.decides(wanted, tag)
                if match is False:  # passed over in hand
                    self._cursors[consumer] = offset + 1
                    continue
                if match is None:  # the record decides: the delivery loop reads it
                    behind = True
                    continue
            if cursor == offset and message is not None and consumer.can_accept():
                # Caught up: deliver the message in hand instead of reading it back later.
                self._send(consumer, offset, pos, message)
            elif cursor <= offset:
                behind = True
        if behind:
            self.vhost.schedule_delivery(self)

    # --- messages out -------------------------------------------------------------------------
    def report_damaged(self, pos: int, error: Exception) -> None:
        # A stream keeps its records: each consumer passing a damaged one skips it; report it once.
        if pos not in self._damaged:
            self._damaged.add(pos)
            super().report_damaged(pos, error)

    def push_many(self, positions: array, persistent: bool, run: PublishRun, first: int) -> None:
        """``push`` for a run stored in one segment: appended at once; a caught-up consumer takes the
        messages in hand while it has credit, as it would one by one."""
        if not positions:
            return
        properties = run.properties
        if isinstance(properties, list):  # each message tagged by its own properties: one by one
            for i, pos in enumerate(positions):
                self.push(pos, persistent, run.message(first + i))
            return
        offset = self.index.append_many(positions)
        tag = self.tags.tag_of(properties)  # a run shares its properties
        self.tags.append(tag, len(positions))
        segment = pos_segment(positions[0])
        if segment != self._tail_segment:
            self._tail_segment = segment
            self._trim(by_size=True)
        if not self.consumers:
            return
        end = offset + len(positions)
        behind = False
        filters = self._filters
        for consumer in self.consumers:
            cursor = self._cursors[consumer]
            if self._skips and consumer in self._skips:
                behind = True
                continue
            wanted = filters.get(consumer) if filters else None
            if wanted is not None and cursor == offset:
                match = self.tags.decides(wanted, tag)
                if match is False:  # the whole run passed over in hand
                    self._cursors[consumer] = end
                    continue
                if match is None:
                    behind = True
                    continue
            if cursor == offset:
                count = self._credit(consumer, end - cursor)
                if count:
                    messages = stamped_run(run.messages(first, count), cursor)
                    run_positions = list(positions[:count])
                    consumer.channel.deliver_run(consumer, run_positions, messages, None)
                    self.offsets.delivered_run(consumer, run_positions, cursor)
                    if not consumer.no_ack:
                        consumer.unacked += count
                    cursor += count
                    self._cursors[consumer] = cursor
            if cursor < end:
                behind = True
        if behind:
            self.vhost.schedule_delivery(self)

    def get(self) -> tuple[int, StoredMessage, bool] | None:
        """basic.get is not supported on streams (RabbitMQ: 540, the connection closes)."""
        raise BrokerConnectionError(NOT_IMPLEMENTED, f"basic.get not supported by stream queues {self._where()}",
                                    *_BASIC_GET)

    def _send(self, consumer: QueueConsumer, offset: int, pos: int, msg: StoredMessage) -> None:
        msg = StoredMessage(msg.timestamp, msg.exchange, msg.routing_key, with_stream_offset(msg.properties, offset),
                            msg.body)
        self._cursors[consumer] = offset + 1
        consumer.channel.deliver(consumer, pos, msg, False)
        self.offsets.delivered(consumer, pos, offset)
        if not consumer.no_ack:
            consumer.unacked += 1

    def deliver(self) -> bool:
        """Feed each consumer from its own cursor while it has credit; True if more could go out now."""
        budget = DELIVERY_BATCH
        index = self.index
        consumers = self.consumers
        n = len(consumers)
        start = self._rr
        self._rr = (start + 1) % n if n else 0
        for k in range(n):
            if not budget:
                break
            consumer = consumers[(start + k) % n]
            cursor = max(self._cursors[consumer], index.first_offset)  # retention may have passed it
            wanted = self._filters.get(consumer)
            skips = self._skips.get(consumer) if self._skips else None
            if skips is not None:
                cursor, used = self._deliver_skipping(consumer, wanted, skips, cursor, budget)
                budget -= used
                self._cursors[consumer] = cursor
                if cursor <= max(skips):
                    continue
                del self._skips[consumer]
            if wanted is not None:
                cursor, used = self._deliver_filtered(consumer, wanted, cursor, budget)
                budget -= used
                if consumer in self._cursors:
                    self._cursors[consumer] = cursor
                continue
            sent = self._deliver_runs(consumer, cursor, budget * RUN_SHARE)
            budget -= run_cost(sent)
            cursor += sent
            end = index.next_offset
            while budget and cursor < end and consumer.can_accept():
                # One at a time only where a run stopped: a hole or a damaged record.
                pos = index.get(cursor)
                cursor += 1
                if pos is None or (msg := self.read(pos)) is None:  # damaged: reported by read()
                    self._cursors[consumer] = cursor
                    continue
                self._send(consumer, cursor - 1, pos, msg)
                budget -= 1
                sent = self._deliver_runs(consumer, cursor, budget * RUN_SHARE)
                budget -= run_cost(sent)
                cursor += sent
            if consumer in self._cursors:
                self._cursors[consumer] = cursor
        return budget == 0

    def _deliver_filtered(self, consumer: QueueConsumer, wanted: StreamFilter, cursor: int,
                          budget: int) -> tuple[int, int]:
        """Deliver the messages from ``cursor`` that match the consumer's filter. The filter-value
        index (stream_tags) finds the next candidate with one search over bytes, so a stretch without
        one (a segment or more) is passed over without reading it; a candidate whose tag decides is
        delivered without decoding its headers, the others are read and matched. A record read or a
        window of ``SCAN_WINDOW`` tags searched costs one of the budget. Returns the next cursor and
        the budget used."""
        index = self.index
        tags = self.tags
        end = index.next_offset
        pattern, exact = tags.scanner(wanted)
        used = 0
        while used < budget and cursor < end and consumer.can_accept():
            stop = min(end, cursor + SCAN_WINDOW)
            cursor = tags.next_candidate(pattern, cursor, stop)
            used += 1
            if cursor >= stop:
                continue
            pos = index.get(cursor)
            cursor += 1
            if pos is None or (msg := self.read(pos)) is None:  # damaged: reported by read()
                continue
            tag = tags.get(cursor - 1)
            if exact and tag != UNKNOWN:
                self._send(consumer, cursor - 1, pos, msg)
                continue
            try:
                headers = peek_headers(msg.properties)
            except ValueError:  # a malformed headers table matches no filter
                headers = None
            if tag == UNKNOWN:  # classified now for the next reader
                tags.set(cursor - 1, tags.tag_of(msg.properties))
            if wanted.matches(headers):
                self._send(consumer, cursor - 1, pos, msg)
        return cursor, used

    def _deliver_skipping(self, consumer: QueueConsumer, wanted: StreamFilter | None, skips: set[int],
                          cursor: int, budget: int) -> tuple[int, int]:
        """A resumed consumer up to the last offset it had settled: one at a time, passing over those
        it settled. Returns the next cursor and the budget used."""
        index = self.index
        stop = min(index.next_offset, max(skips) + 1)
        used = 0
        while used < budget and cursor < stop and consumer.can_accept():
            offset = cursor
            cursor += 1
            used += 1
            if offset in skips or (pos := index.get(offset)) is None or (msg := self.read(pos)) is None:
                continue
            if wanted is not None:
                try:
                    headers = peek_headers(msg.properties)
                except ValueError:
                    headers = None
                if not wanted.matches(headers):
                    continue
            self._send(consumer, offset, pos, msg)
        if cursor >= index.next_offset:  # the log ends before them (they were trimmed or lost)
            cursor = max(cursor, max(skips) + 1)
        return cursor, used

    def _credit(self, consumer: QueueConsumer, limit: int) -> int:
        """How many of ``limit`` messages may go to ``consumer`` now as one run: its prefetch, the
        channel's, the channel's output and the run length (about 1 MiB of bodies)."""
        channel = consumer.channel
        if limit <= 0 or not channel.can_deliver():
            return 0
        count = min(limit, channel.delivery_room(), self._run_limit)
        if consumer.prefetch and not consumer.no_ack:
            count = min(count, consumer.prefetch - consumer.unacked)
        return max(count, 0)

    def _deliver_runs(self, consumer: QueueConsumer, cursor: int, budget: int) -> int:
        """Deliver from ``cursor`` to ``consumer`` in runs (positions, records and frames of a run
        each in one call) while credit and ``budget`` last; stops before a hole or a damaged record.
        Returns how many were delivered; the caller stores the cursor."""
        index = self.index
        channel = consumer.channel
        store = self.vhost.store.messages
        read_many = store.read_many
        # AMQP's channels frame a run straight from its segment (compiled); a run it takes none of goes below
        from_segment = getattr(channel, "deliver_segment_run", None) if FRAMES_COMPILED else None
        frames_of = partial(segment_frames, store)
        sent = 0
        while budget:
            count = self._credit(consumer, min(budget, index.next_offset - cursor))
            if not count:
                break
            positions = index.get_many(cursor, count)
            if 0 in positions:  # a hole: deliver up to it
                positions = positions[:positions.index(0)]
                if not positions:
                    break
            if from_segment is not None and (framed := from_segment(consumer, positions, cursor, frames_of,
                                                                       _SPLICES))[0]:
                count, first_size, last_size = framed
                if count < len(positions):
                    positions = positions[:count]
            else:
                if from_segment is not None:  # one record the general way (a new block's splice made, a
                    positions = positions[:1]  # large record, a damaged one reported), then back to the above
                try:
                    messages = read_many(positions)
                except (CorruptRecord, KeyError):
                    break  # the one-at-a-time path reports it and goes on
                count = len(positions)
                first_size, last_size = len(messages[0].body), len(messages[-1].body)
                if (own := getattr(channel, "deliver_stamped_run", None)) is None:  # AMQP's stamps as it frames
                    channel.deliver_run(consumer, positions, stamped_run(messages, cursor), None)
                else:
                    own(consumer, positions, messages, cursor, _SPLICES, stamped_run)
            # the next run's length from this one's body sizes (as classic queues size theirs)
            self._run_limit = max(1, RUN_BYTES // ((first_size + last_size) // 2 + 64))
            self.offsets.delivered_run(consumer, positions, cursor)
            if not consumer.no_ack:
                consumer.unacked += count
            cursor += count
            budget -= count
            sent += count
        return sent

    # --- acknowledgements: credit only ----------------------------------------------------------
    def ack(self, pos: int) -> None:
        """Nothing is removed from a stream; the channel already returned the credit to the consumer.
        A tracked consumer's offset moves past it."""
        if self.offsets.active:
            self.offsets.settled(pos)

    def ack_many(self, positions: list[int]) -> None:
        """basic.ack multiple=true: credit only too, without a call per delivery."""
        if self.offsets.active:
            self.offsets.settled_many(positions)

    def requeue(self, pos: int) -> None:
        """nack/reject (and a closed channel's unacked deliveries): credit only, as RabbitMQ 4 does; a
        tracked consumer's offset stays at it (delivered again when the consumer comes back)."""

    def requeue_many(self, positions: list[int]) -> None:
        """A closing channel's whole credit window back: nothing to do, as for one."""

    def reject(self, pos: int) -> None:
        """nack/reject without requeue: credit only too (nothing is dead-lettered from a stream); a
        tracked consumer's offset moves past it."""
        if self.offsets.active:
            self.offsets.settled(pos)

    def purge(self) -> int:
        raise BrokerConnectionError(NOT_IMPLEMENTED, f"queue.purge not supported by stream queues {self._where()}",
                                    *_QUEUE_PURGE)

    # --- consumers ----------------------------------------------------------------------------
    def start_offset(self, arguments: dict[str, Any] | None, now_ms: int | None = None) -> int:
        """Where a consumer with these arguments starts reading."""
        index = self.index
        try:
            kind, value = parse_stream_offset((arguments or {}).get(OFFSET_HEADER), now_ms=now_ms)
        except ValueError:  # the channel validates first; be lenient for other callers
            kind, value = "next", 0
        if kind == "first":
            return index.first_offset
        if kind == "last":
            return index.last_offset if index.count else index.next_offset
        if kind == "offset":
            return min(max(value, index.first_offset), index.next_offset)
        if kind == "from_end":
            return max(index.next_offset - value, index.first_offset)
        if kind == "timestamp":
            return index.offset_for_timestamp(value)
        return index.next_offset

    def validate_consumer(self, no_ack: bool, prefetch: int, arguments: dict[str, Any] | None,
                          global_prefetch: int = 0) -> None:
        validate_stream_consumer(no_ack, prefetch, arguments, queue=self.name, vhost=self.vhost.name,
                                 global_prefetch=global_prefetch)

    def add_consumer(self, consumer: QueueConsumer) -> None:
        start = self.start_offset(consumer.arguments)
        tracked = tracking_requested(consumer.tag, consumer.arguments)  # validated by validate_consumer
        resume = None
        if tracked and OFFSET_HEADER not in (consumer.arguments or {}):
            resume = self.offsets.resume_offset(consumer.tag)
            if resume is not None:  # where it left off, unless retention has passed it
                start = min(max(resume, self.index.first_offset), self.index.next_offset)
        self._cursors[consumer] = start
        if tracked:
            skips = self.offsets.resume_skips(consumer.tag) if resume is not None else frozenset()
            skips = frozenset(o for o in skips if o >= start)
            self.offsets.attach(consumer, consumer.tag, start, skips)
            if skips:
                self._skips[consumer] = set(skips)
        wanted = stream_filter(consumer.arguments)  # validated by validate_consumer
        if wanted is not None:
            self._filters[consumer] = wanted
        self.consumers.append(consumer)
        self.vhost.schedule_delivery(self)

    def remove_consumer(self, consumer: QueueConsumer, *, notify: bool = False) -> None:
        """Detach a consumer; ``notify`` tells its channel (basic.cancel from the server)."""
        try:
            self.consumers.remove(consumer)
        except ValueError:
            return
        self.offsets.detach(consumer)
        self._cursors.pop(consumer, None)
        self._filters.pop(consumer, None)
        self._skips.pop(consumer, None)
        if notify:
            consumer.channel.consumer_cancelled(consumer)

    def delete(self) -> int:
        """Remove the stream's log and files; consumers get basic.cancel."""
        count = self.index.count
        self.deleted = True
        self.offsets.drop()
        for consumer in list(self.consumers):
            self.consumers.remove(consumer)
            self._cursors.pop(consumer, None)
            self._filters.pop(consumer, None)
            self._skips.pop(consumer, None)
            consumer.channel.consumer_cancelled(consumer)
        self.vhost.store.delete_queue(self.index)
        return count
