"""A channel's deliveries awaiting acknowledgement, and the model operations on them.

One ``Deliveries`` per channel (any protocol's session): it numbers deliveries, counts them on their
queue and in the counters of the session's protocol, and settles them with one rule. Settling: the
queue acks (counting ``ack``), requeues, or rejects (dead-lettering, counting ``reject``); the
consumer gets its prefetch credit back; a queue with consumers and ready messages is asked to
deliver again; with a channel-wide prefetch the session is told that room was freed.
Runs (deliver runs, ack runs) are booked once per run: the unacked deliveries are kept as runs
(``UnackedBook``: one entry per delivery run with its positions), and acks in delivery order take
whole slices of them, with no object per message.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterator, Mapping
from itertools import repeat
from operator import attrgetter
from typing import TYPE_CHECKING, NamedTuple

from ..errors import PRECONDITION_FAILED, BrokerChannelError

if TYPE_CHECKING:
    from ...store.record import StoredMessage
    from ..metrics.stats import ProtocolCounters
    from ..queues.base import QueueKind
    from ..queues.consumer import Consumer
    from ..vhost import VHost


class Unacked(NamedTuple):
    queue: QueueKind
    pos: int
    consumer: Consumer | None  # None for basic.get


_new_tuple = tuple.__new__


class _Run:
    """Deliveries with consecutive tags from ``first`` of one queue to one consumer (None: basic.get)."""

    __slots__ = ("first", "queue", "consumer", "positions", "done", "settled", "live", "owned")

    def __init__(self, first: int, queue: QueueKind, consumer: Consumer | None, positions: list[int],
                 owned: bool) -> None:
        self.first = first
        self.queue = queue
        self.consumer = consumer
        self.positions = positions  # not copied: never changed unless ``owned`` (a run of single deliveries)
        self.done = 0  # the leading entries already settled
        self.settled: set[int] | None = None  # offsets from ``done`` on settled out of order
        self.live = len(positions)
        self.owned = owned


_first_tag = attrgetter("first")
# Deliveries one at a time join the channel's last run up to this many: a run's list is freed only once
# all of it is settled, and a consumer that always has some unacked would otherwise grow it for good.
OWNED_RUN_MAX = 1024
# A piece of settled deliveries: their queue, their consumer and their positions, in delivery order.
Piece = tuple["QueueKind", "Consumer | None", list[int]]


class UnackedBook(Mapping[int, Unacked]):
    """A channel's unacked deliveries by delivery tag, in delivery order, kept as runs.

    Reads as a mapping of tag to ``Unacked``; ``take_consecutive`` and ``take_upto`` settle the
    common cases (acks in delivery order, basic.ack multiple) a slice of a run at a time."""

    __slots__ = ("_runs", "_head", "_count")

    def __init__(self) -> None:
        self._runs: list[_Run] = []
        self._head = 0  # runs before it are settled
        self._count = 0

    # --- booking ------------------------------------------------------------------------------
    def add(self, tag: int, queue: QueueKind, pos: int, consumer: Consumer | None) -> None:
        """One delivery; it joins the last run when it continues it."""
        runs = self._runs
        if len(runs) > self._head:
            last = runs[-1]
            if (last.owned and last.queue is queue and last.consumer is consumer and last.settled is None
                    and last.first + len(last.positions) == tag and len(last.positions) < OWNED_RUN_MAX):
                last.positions.append(pos)
                last.live += 1
                self._count += 1
                return
        runs.append(_Run(tag, queue, consumer, [pos], True))
        self._count += 1

    def add_run(self, first: int, queue: QueueKind, consumer: Consumer | None, positions: list[int]) -> None:
        """A run of deliveries, tags from ``first``; ``positions`` is kept as it is (not changed later)."""
        if len(positions) == 1:  # (a round of one delivery per consumer): joins the channel's last run
            self.add(first, queue, positions[0], consumer)
            return
        self._runs.append(_Run(first, queue, consumer, positions, False))
        self._count += len(positions)

    # --- the mapping ------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[int]:
        for run in self._runs[self._head:]:
            if not run.live:
                continue
            settled = run.settled
            first = run.first
            for offset in range(run.done, len(run.positions)):
                if settled is None or offset not in settled:
                    yield first + offset

    def __getitem__(self, tag: int) -> Unacked:
        run, offset = self._find(tag)
        if run is None:
            raise KeyError(tag)
        return _new_tuple(Unacked, (run.queue, run.positions[offset], run.consumer))

    def __contains__(self, tag: object) -> bool:
        return isinstance(tag, int) and self._find(tag)[0] is not None

    def _find(self, tag: int) -> tuple[_Run | None, int]:
        """The run holding the unsettled delivery ``tag`` and its offset there, or (None, 0)."""
        runs = self._runs
        head = self._head
        if head >= len(runs):
            return None, 0
        run = runs[head]
        if tag >= run.first + len(run.positions):
            i = bisect_right(runs, tag, head, len(runs), key=_first_tag) - 1
            if i < head:
                return None, 0
            run = runs[i]
        offset = tag - run.first
        if offset < run.done or offset >= len(run.positions) or (run.settled is not None and offset in run.settled):
            return None, 0
        return run, offset

    # --- settling ---------------------------------------------------------------------------------
    def pop(self, tag: int, default: Unacked | None = None) -> Unacked | None:
        """Settle the delivery ``tag``: its record, or ``default`` when it is not unacked."""
        run, offset = self._find(tag)
        if run is None:
            return default
        item = _new_tuple(Unacked, (run.queue, run.positions[offset], run.consumer))
        if offset == run.done:
            run.done += 1
            settled = run.settled
            if settled:
                while run.done in settled:
                    settled.discard(run.done)
                    run.done += 1
                if not settled:
                    run.settled = None
        elif run.settled is None:
            run.settled = {offset}
        else:
            run.settled.add(offset)
        run.live -= 1
        self._count -= 1
        if not run.live:
            self._drop_settled()
        return item

    def take_consecutive(self, first: int, count: int) -> list[Piece] | None:
        """Settle the deliveries with tags ``first`` .. ``first + count - 1`` when they are the oldest
        unsettled ones and settle whole run slices (acks in delivery order): their pieces. None (and
        nothing settled) otherwise."""
        runs = self._runs
        i = self._head
        end = len(runs)
        tag = first
        left = count
        spans: list[tuple[_Run, int]] = []
        while left:
            if i >= end:
                return None
            run = runs[i]
            if not run.live:
                i += 1
                continue
            if run.settled is not None or run.first + run.done != tag:
                return None
            take = min(left, run.live)
            spans.append((run, take))
            tag += take
            left -= take
            i += 1
        pieces: list[Piece] = []
        for run, take in spans:
            done = run.done
            pieces.append((run.queue, run.consumer, run.positions[done:done + take]))
            run.done = done + take
            run.live -= take
        self._count -= count
        self._drop_settled()
        return pieces

    def take_upto(self, tag: int) -> list[tuple[int, Piece]]:
        """Settle every delivery with a tag up to ``tag`` (0: all): (first tag, piece) per run slice,
        in delivery order."""
        runs = self._runs
        taken: list[tuple[int, Piece]] = []
        count = 0
        for i in range(self._head, len(runs)):
            run = runs[i]
            if not run.live:
                continue
            first, done, settled = run.first, run.done, run.settled
            if tag and first + done > tag:
                break
            stop = len(run.positions) if not tag else min(len(run.positions), tag - first + 1)
            if settled is None:
                taken.append((first + done, (run.queue, run.consumer, run.positions[done:stop])))
                run.live -= stop - done
                count += stop - done
            else:  # some settled out of order: the slices between them
                start = done
                for offset in range(done, stop + 1):
                    if offset == stop or offset in settled:
                        if offset > start:
                            taken.append((first + start, (run.queue, run.consumer, run.positions[start:offset])))
                            run.live -= offset - start
                            count += offset - start
                        start = offset + 1
                run.settled = {o for o in settled if o >= stop} or None
            run.done = stop
            if run.settled is not None:  # settled ones right after the slice move the start on
                while run.done in run.settled:
                    run.settled.discard(run.done)
                    run.done += 1
                if not run.settled:
                    run.settled = None
        self._count -= count
        self._drop_settled()
        return taken

    def take_all(self) -> list[tuple[int, Unacked]]:
        """Settle every delivery: (tag, record) of each, in delivery order."""
        items = list(self.items())
        self._runs = []
        self._head = self._count = 0
        return items

    def restore(self, items: list[tuple[int, Unacked]]) -> None:
        """Deliveries settled and given back (tx.rollback): unacked again, in delivery order."""
        merged = sorted([*self.items(), *items])
        self._runs = []
        self._head = self._count = 0
        for tag, (queue, pos, consumer) in merged:
            self.add(tag, queue, pos, consumer)

    def _drop_settled(self) -> None:
        """Move the head past settled runs; drop them from the list once they are many."""
        runs = self._runs
        head = self._head
        end = len(runs)
        while head < end and not runs[head].live:
            head += 1
        if head == end:
            runs.clear()
            head = 0
        elif head > 32 and head * 2 > end:
            del runs[:head]
            head = 0
        self._head = head


def get_one(queue: QueueKind, no_ack: bool, counters: ProtocolCounters) -> tuple[int, StoredMessage, bool] | None:
    """basic.get (and the HTTP API's get): take the head message, counted as a get. With ``no_ack``
    it is settled at once. None when the queue is empty (the queue counts the empty get)."""
    got = queue.get()
    if got is None:
        return None
    stats = queue.stats
    if no_ack:
        queue.ack(got[0])
        stats.get_no_ack += 1
        counters.get_no_ack += 1
    else:
        stats.get += 1
        counters.get += 1
    if got[2]:
        stats.redeliver += 1
        counters.redeliver += 1
    return got


class Deliveries:
    """The unacked deliveries of one channel, by delivery tag, in delivery order."""

    __slots__ = ("unacked", "tag", "prefetch", "counters", "_vhost", "_schedule", "_room_freed", "_channel")

    def __init__(self, vhost: VHost, room_freed: Callable[[], None], counters: ProtocolCounters, *,
                 channel: bool = True) -> None:
        """``counters``: the session's protocol's, counted with the queues'. ``channel``: the books of
        an AMQP channel, counted in the node's channel churn (an MQTT client's are not: it has no
        channels)."""
        self.unacked = UnackedBook()
        self.tag = 0  # the last delivery tag given
        self.prefetch = 0  # the channel-wide prefetch (basic.qos global=true); 0 = none
        self.counters = counters
        self._vhost = vhost
        self._schedule = vhost.schedule_delivery
        self._room_freed = room_freed  # the session delivers again to its own consumers
        self._channel = channel
        if channel:
            vhost.node_counters.channels_opened += 1  # a channel's books open with it (closed in close())

    def set_prefetch(self, prefetch: int) -> None:
        """The channel-wide prefetch (0: none), counted in the vhost's ``channel_wide_prefetches``."""
        self._vhost.channel_wide_prefetches += bool(prefetch) - bool(self.prefetch)
        self.prefetch = prefetch

    def room(self) -> int:
        """How many more deliveries the channel-wide prefetch allows now."""
        if not self.prefetch:
            return 1 << 30
        return self.prefetch - len(self.unacked)

    # --- deliver and get ----------------------------------------------------------------------
    def deliver(self, consumer: Consumer, pos: int, redelivered: bool) -> int:
        """One delivery to ``consumer``: its tag. Counted on the queue; held until settled unless no-ack."""
        tag = self.tag = self.tag + 1
        queue = consumer.queue
        stats = queue.stats
        counters = self.counters
        if not consumer.no_ack:
            self.unacked.add(tag, queue, pos, consumer)
            stats.deliver += 1
            counters.deliver += 1
        else:
            stats.deliver_no_ack += 1
            counters.deliver_no_ack += 1
        if redelivered:
            stats.redeliver += 1
            counters.redeliver += 1
        return tag

    def deliver_run(self, consumer: Consumer, positions: list[int], redelivered: list[bool] | None) -> int:
        """``deliver`` for a run of one consumer's deliveries, booked once: the first tag of the run."""
        count = len(positions)
        first = self.tag + 1
        self.tag += count
        queue = consumer.queue
        stats = queue.stats
        counters = self.counters
        if not consumer.no_ack:
            self.unacked.add_run(first, queue, consumer, positions)
            stats.deliver += count
            counters.deliver += count
        else:
            stats.deliver_no_ack += count
            counters.deliver_no_ack += count
        if redelivered is not None:
            redelivered_count = sum(redelivered)
            stats.redeliver += redelivered_count
            counters.redeliver += redelivered_count
        return first

    def next_tag(self) -> int:
        """A tag for a delivery that is never acknowledged and belongs to no queue (direct reply-to)."""
        tag = self.tag = self.tag + 1
        return tag

    def get(self, queue: QueueKind, no_ack: bool) -> tuple[int, StoredMessage, bool] | None:
        """basic.get: (delivery tag, message, redelivered), or None when the queue is empty."""
        got = get_one(queue, no_ack, self.counters)
        if got is None:
            return None
        pos, msg, redelivered = got
        tag = self.tag = self.tag + 1
        if not no_ack:
            self.unacked.add(tag, queue, pos, None)
        return tag, msg, redelivered

    # --- settle -------------------------------------------------------------------------------
    def take(self, delivery_tag: int, multiple: bool) -> list[tuple[int, Unacked]]:
        """Remove and return the deliveries an ack/nack/reject names (406 for an unknown tag)."""
        unacked = self.unacked
        if multiple:
            if delivery_tag == 0:
                return unacked.take_all()
            taken = [(first + i, _new_tuple(Unacked, (queue, pos, consumer)))
                     for first, (queue, consumer, positions) in unacked.take_upto(delivery_tag)
                     for i, pos in enumerate(positions)]
            if taken:
                return taken
        else:
            item = unacked.pop(delivery_tag, None)
            if item is not None:
                return [(delivery_tag, item)]
        raise BrokerChannelError(PRECONDITION_FAILED, f"unknown delivery tag {delivery_tag}")

    def ack_multiple(self, delivery_tag: int) -> None:
        """basic.ack multiple=true outside a transaction: ``settle(take(delivery_tag, True), None)``
        a run slice at a time (406 when nothing is unacked up to the tag)."""
        pieces = [piece for _first, piece in self.unacked.take_upto(delivery_tag)]
        if not pieces:
            if delivery_tag == 0:  # "everything so far", of which there is nothing: as take() answers
                return
            raise BrokerChannelError(PRECONDITION_FAILED, f"unknown delivery tag {delivery_tag}")
        self._ack_pieces(pieces)

    def ack_run(self, tags: list[int]) -> int | None:
        """basic.ack (multiple=false) of each tag, in order, settled as one batch with the outcome of
        acking them one by one. Returns None, or the index of the first unknown tag: the acks before
        it were applied, it and those after it were not."""
        unacked = self.unacked
        count = len(tags)
        first = tags[0]
        if count == 1 or (tags[-1] - first == count - 1 and tags == [*range(first, first + count)]):
            pieces = unacked.take_consecutive(first, count)  # acks in delivery order: whole run slices
            if pieces is not None:
                self._ack_pieces(pieces)
                return None
        if count == 1:
            item = unacked.pop(first, None)
            if item is None:
                return 0
            self._ack_pieces([(item[0], item[2], [item[1]])])
            return None
        items = list(map(unacked.pop, tags, repeat(None)))  # None for an unknown tag
        if None in items:
            bad = items.index(None)
            # Those after the unknown tag stay unacked (returned to their queues as the channel closes).
            unacked.restore([(tag, item) for tag, item in zip(tags[bad + 1:], items[bad + 1:], strict=True)
                             if item is not None])
            if bad:
                self._acks(items[:bad])  # type: ignore[arg-type]
            return bad
        self._acks(items)  # type: ignore[arg-type]
        return None

    def _acked_run(self, queue: QueueKind, count: int) -> None:
        """The books after ``count`` acks of one queue's deliveries: counted, and the queue and the
        channel's window given their chance to deliver again."""
        queue.stats.ack += count
        self.counters.ack += count
        if queue.consumers and queue.message_count:
            self._schedule(queue)
        if self.prefetch:
            self._room_freed()

    def _ack_pieces(self, pieces: list[Piece]) -> None:
        """Acks of run slices (each of one queue and one consumer), in delivery order."""
        if len(pieces) == 1:
            queue, consumer, positions = pieces[0]
            count = len(positions)
            if consumer is not None:
                consumer.credit(count)
            if count == 1:
                queue.ack(positions[0])
            else:
                queue.ack_many(positions)
            self._acked_run(queue, count)
            return
        touched: dict[QueueKind, None] = {}
        total = 0
        run_queue, run_consumer = pieces[0][0], pieces[0][1]
        run: list[int] = []
        for queue, consumer, positions in pieces:  # one ack_many per queue and consumer in a row
            if queue is not run_queue or consumer is not run_consumer:
                _ack_positions(run_queue, run_consumer, run)
                run_queue, run_consumer, run = queue, consumer, []
            run += positions
            touched[queue] = None
            total += len(positions)
        _ack_positions(run_queue, run_consumer, run)
        self.counters.ack += total
        self._settled(touched)

    def settle(self, items: list[tuple[int, Unacked]], requeue: bool | None, failed: bool = False) -> None:
        """Settle taken deliveries: requeue None = ack; True = back to their queue (``failed``: by
        basic.reject, which RabbitMQ 4.3 counts as a failed delivery); False = rejected
        (dead-lettered when the queue has a dead-letter exchange)."""
        if not items:
            return
        if requeue is None:
            self._acks([item for _tag, item in items])
            return
        credits: dict[Consumer, int] = {}
        touched: dict[QueueKind, None] = {}
        for _tag, (queue, pos, consumer) in items:
            if consumer is not None:
                credits[consumer] = credits.get(consumer, 0) + 1
            if requeue:
                if failed:
                    queue.requeue_failed(pos)
                else:
                    queue.requeue(pos)
            else:
                queue.reject(pos)
                queue.stats.reject += 1
                self.counters.reject += 1
            touched[queue] = None
        for consumer, count in credits.items():
            consumer.credit(count)
        self._settled(touched)

    def requeue_all(self) -> None:
        """basic.recover, and a closing channel: every unacked delivery back to its queue, in order."""
        self.settle(self.unacked.take_all(), True)

    def restore(self, items: list[tuple[int, Unacked]]) -> None:
        """Deliveries taken by acks that were rolled back (tx.rollback): unacked again, in order."""
        if items:
            self.unacked.restore(items)

    def close(self, confirm_publishes: int) -> None:
        """The channel is gone: its unacked deliveries go back to their queues in order; the node
        keeps its count of confirm-mode publishes (read from open channels at scrape time)."""
        counters = self._vhost.node_counters
        if self._channel:
            counters.channels_closed += 1
        counters.received_confirm_closed += confirm_publishes
        self.set_prefetch(0)
        self.requeue_all()

    def _acks(self, items: list[Unacked]) -> None:
        """Acks, one ack_many per run of deliveries of one queue to one consumer."""
        count = len(items)
        queues, positions, consumers = zip(*items, strict=True)
        queue, consumer = queues[0], consumers[0]
        if queues.count(queue) == count and consumers.count(consumer) == count:
            # The common case: every delivery from one consumer (or all from basic.get) of one queue.
            if consumer is not None:
                consumer.credit(count)
            queue.ack_many(list(positions))
            self._acked_run(queue, count)
            return
        touched: dict[QueueKind, None] = {}
        run_queue, run_consumer = queue, consumer
        run: list[int] = []
        for queue, pos, consumer in items:
            if queue is not run_queue or consumer is not run_consumer:
                _ack_positions(run_queue, run_consumer, run)
                run_queue, run_consumer, run = queue, consumer, []
            touched[queue] = None
            run.append(pos)
        _ack_positions(run_queue, run_consumer, run)
        self.counters.ack += count
        self._settled(touched)

    def _settled(self, queues: dict[QueueKind, None]) -> None:
        """After settling: queues that can use the freed credit deliver; the channel's room too."""
        schedule = self._schedule
        for queue in queues:
            if queue.consumers and queue.message_count:
                schedule(queue)
        if self.prefetch:
            self._room_freed()


def _ack_positions(queue: QueueKind, consumer: Consumer | None, positions: list[int]) -> None:
    if positions:
        if consumer is not None:
            consumer.credit(len(positions))
        queue.ack_many(positions)
        queue.stats.ack += len(positions)
