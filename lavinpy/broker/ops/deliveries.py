"""A channel's deliveries awaiting acknowledgement, and the model operations on them.

One ``Deliveries`` per channel (any protocol's session): it numbers deliveries, counts them on their
queue and in the counters of the session's protocol, and settles them with one rule. Settling: the
queue acks (counting ``ack``), requeues, or rejects (dead-lettering, counting ``reject``); the
consumer gets its prefetch credit back; a queue with consumers and ready messages is asked to
deliver again; with a channel-wide prefetch the session is told that room was freed.
Runs (deliver runs, ack runs) are booked once per run: the unacked deliveries are kept as runs
(``UnackedBook``, unacked_book.py: one entry per delivery run with its positions), and acks in
delivery order take whole slices of them, with no object per message.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import repeat
from typing import TYPE_CHECKING

from ..errors import PRECONDITION_FAILED, BrokerChannelError
from .unacked_book import Piece, Unacked, UnackedBook, _new_tuple

if TYPE_CHECKING:
    from ...store.record import StoredMessage
    from ..metrics.stats import ProtocolCounters
    from ..queues.base import QueueKind
    from ..queues.consumer import Consumer
    from ..vhost import VHost


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

    __slots__ = ("unacked", "tag", "prefetch", "counters", "deferred_acks", "freed", "_vhost", "_schedule",
                 "_room_freed", "_channel")

    def __init__(self, vhost: VHost, room_freed: Callable[[], None], counters: ProtocolCounters, *,
                 channel: bool = True) -> None:
        """``counters``: the session's protocol's, counted with the queues'. ``channel``: the books of
        an AMQP channel, counted in the node's channel churn (an MQTT client's are not: it has no
        channels)."""
        self.unacked = UnackedBook()
        self.tag = 0  # the last delivery tag given
        self.prefetch = 0  # the channel-wide prefetch (basic.qos global=true); 0 = none
        self.counters = counters
        # Set by a connection that writes right after its input step: the queue side of in-order acks
        # (their index and segment updates) waits here until that write is out (``settle_deferred``).
        self.deferred_acks: list[tuple[QueueKind, list[int]]] | None = None
        # Set (to a list) by a caller that runs the freed queues' steps itself right after its acks: the
        # queues those acks let deliver again are collected here instead of waiting in the scheduler's set.
        self.freed: list[QueueKind] | None = None
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

    def ack_multiple(self, delivery_tag: int) -> int:
        """basic.ack multiple=true outside a transaction: ``settle(take(delivery_tag, True), None)``
        a run slice at a time (406 when nothing is unacked up to the tag). Returns how many it acked."""
        pieces = [piece for _first, piece in self.unacked.take_upto(delivery_tag)]
        if not pieces:
            if delivery_tag == 0:  # "everything so far", of which there is nothing: as take() answers
                return 0
            raise BrokerChannelError(PRECONDITION_FAILED, f"unknown delivery tag {delivery_tag}")
        return self._ack_pieces(pieces)

    def ack_run(self, tags: list[int]) -> int | None:
        """basic.ack (multiple=false) of each tag, in order, settled as one batch with the outcome of
        acking them one by one. Returns None, or the index of the first unknown tag: the acks before
        it were applied, it and those after it were not."""
        unacked = self.unacked
        count = len(tags)
        first = tags[0]
        if count == 1 or (tags[-1] - first == count - 1 and tags == [*range(first, first + count)]):
            runs = unacked._runs
            head = unacked._head
            if head < len(runs):
                # The commonest case inline: the oldest deliveries of the channel's first run (a
                # consumer acking in delivery order, its shares of several rounds joined in one run).
                run = runs[head]
                done = run.done
                if run.first + done == first and run.live >= count and run.settled is None:
                    consumer, queue = run.consumer, run.queue
                    run.done = done + count
                    run.live -= count
                    unacked._count -= count
                    if consumer is not None:
                        consumer.credit(count)
                    later = self.deferred_acks
                    if later is not None:  # the books and the window now, the queue's index after the write
                        later.append((queue, run.positions[done:done + count]))
                    elif count == 1:
                        queue.ack(run.positions[done])
                    else:
                        queue.ack_many(run.positions[done:done + count])
                    if not run.live:
                        unacked._drop_settled()
                    self._acked_run(queue, count)
                    return None
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

    def ack_run_before_write(self, tags: list[int]) -> None:
        """``ack_run`` for a caller that writes its output right after, then calls ``settle_deferred``:
        the queue side of the acks waits for that write, and each queue the acks let deliver again runs
        its step now (``DeliveryScheduler.deliver_now``), as the turn the caller runs next would."""
        self.deferred_acks = []
        freed: list[QueueKind] = []
        self.freed = freed
        try:
            self.ack_run(tags)
        finally:
            self.freed = None
        for queue in freed:
            self._vhost.broker.scheduler.deliver_now(queue)

    def settle_deferred(self) -> None:
        """The queue side of the acks ``ack_run`` deferred (``deferred_acks``), applied in their order;
        deferring ends."""
        later = self.deferred_acks
        self.deferred_acks = None
        if later:
            for queue, positions in later:
                if len(positions) == 1:  # a read of one PUBACK: the single ack skips the run's bookkeeping
                    queue.ack(positions[0])
                else:
                    queue.ack_many(positions)

    def _acked_run(self, queue: QueueKind, count: int) -> None:
        """The books after ``count`` acks of one queue's deliveries: counted, and the queue and the
        channel's window given their chance to deliver again."""
        queue.stats.ack += count
        self.counters.ack += count
        if queue.consumers and queue.message_count:
            freed = self.freed
            if freed is None:
                self._schedule(queue)
            else:
                freed.append(queue)
        if self.prefetch:
            self._room_freed()

    def _ack_pieces(self, pieces: list[Piece]) -> int:
        """Acks of run slices (each of one queue and one consumer), in delivery order; returns how many."""
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
            return count
        shares: dict[tuple[QueueKind, Consumer | None], list[list[int]]] = {}
        total = 0
        for queue, consumer, positions in pieces:
            share = shares.get((queue, consumer))
            if share is None:
                shares[queue, consumer] = [positions]
            else:
                share.append(positions)
            total += len(positions)
        self._ack_shares(shares, total, total >= len(pieces) * _WHOLE_PIECES)
        return total

    def _ack_shares(self, shares: dict[tuple[QueueKind, Consumer | None], list[list[int]]], total: int,
                    piece_by_piece: bool = False) -> None:
        """One ack_many per queue and consumer, each with its positions in delivery order (the queue's
        unacked runs are per consumer, and consumers sharing a channel interleave their deliveries
        there); or, for pieces this long, one ack_many a piece (each a run of the queue's, not copied)."""
        for (queue, consumer), parts in shares.items():
            if len(parts) == 1 or piece_by_piece:
                for positions in parts:
                    _ack_positions(queue, consumer, positions)
            else:
                _ack_positions(queue, consumer, [pos for positions in parts for pos in positions])
        self.counters.ack += total
        self._settled(dict.fromkeys(queue for queue, _consumer in shares))

    def settle(self, items: list[tuple[int, Unacked]], requeue: bool | None, failed: bool = False) -> None:
        """Settle taken deliveries: requeue None = ack; True = back to their queue (``failed``: by
        basic.reject, which RabbitMQ 4.3 counts as a failed delivery); False = rejected
        (dead-lettered when the queue has a dead-letter exchange)."""
        if not items:
            return
        if requeue is None:
            self._acks([item for _tag, item in items])
            return
        if requeue and not failed:
            self._requeue([(queue, consumer, [pos]) for _tag, (queue, pos, consumer) in items])
            return
        credits: dict[Consumer, int] = {}
        touched: dict[QueueKind, None] = {}
        for _tag, (queue, pos, consumer) in items:
            if consumer is not None:
                credits[consumer] = credits.get(consumer, 0) + 1
            if requeue:
                queue.requeue_failed(pos)
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
        self._requeue(self.unacked.take_all_pieces())

    def _requeue(self, pieces: list[Piece]) -> None:
        """Settled deliveries back to their queues: one ``requeue_many`` a queue, with its positions in
        delivery order (a channel closing with a consumer's 65,535 unacked is one call, not 65,535)."""
        credits: dict[Consumer, int] = {}
        shares: dict[QueueKind, list[int]] = {}
        for queue, consumer, positions in pieces:
            if consumer is not None:
                credits[consumer] = credits.get(consumer, 0) + len(positions)
            share = shares.get(queue)
            if share is None:
                shares[queue] = positions if len(pieces) == 1 else list(positions)
            else:
                share += positions
        for queue, share in shares.items():
            queue.requeue_many(share)
        for consumer, count in credits.items():
            consumer.credit(count)
        self._settled(dict.fromkeys(shares))

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
        """Acks, one ack_many per queue and consumer (``_ack_shares``)."""
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
        shares: dict[tuple[QueueKind, Consumer | None], list[int]] = {}
        for queue, pos, consumer in items:
            shares.setdefault((queue, consumer), []).append(pos)
        self._ack_shares({key: [share] for key, share in shares.items()}, count)

    def _settled(self, queues: dict[QueueKind, None]) -> None:
        """After settling: queues that can use the freed credit deliver; the channel's room too."""
        schedule = self._schedule
        for queue in queues:
            if queue.consumers and queue.message_count:
                schedule(queue)
        if self.prefetch:
            self._room_freed()


# Pieces of a multiple ack this long on average (a queue's delivery runs, whole) are acked one by one:
# a call each costs less than copying them all into one list and comparing it with the runs.
_WHOLE_PIECES = 256


def _ack_positions(queue: QueueKind, consumer: Consumer | None, positions: list[int]) -> None:
    if positions:
        if consumer is not None:
            consumer.credit(len(positions))
        queue.ack_many(positions)
        queue.stats.ack += len(positions)
