"""A classic queue: its store index, its consumers, and the one delivery loop that feeds them."""

from __future__ import annotations

import asyncio
import itertools
import logging
from array import array
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ...store.record import CorruptRecord, StoredMessage
from ...store.unacked_positions import PositionSet
from ..metrics.stats import MessageCounters
from ..settings.deduplication import settings_of
from .base import DELIVERY_BATCH, FIRST_RUN, RUN_BYTES, RUN_SHARE, QueueHost, QueueKind
from .consumer_set import ConsumerSet, deliver_picks
from .dedup_cache import DedupCache, file_name
from .features import QueueFeatures
from .round_picks import deliver_share, pick_round, shares_of
from .stored_runs import deliver_stored, deliver_stored_round, readable, stored_run_of

if TYPE_CHECKING:
    from ...store.queue_index import QueueIndex
    from ..settings.arguments import QueueSettings
    from .publish_run import PublishRun
    from .queue_consumer import QueueConsumer

log = logging.getLogger("lavinpy.queue")


# The message paths a queue takes from its feature component while it uses a feature (see use_features).
FEATURE_PATHS = ("push", "push_many", "deliver", "refuses", "_take_head")


class Queue(QueueKind):
    """A classic queue (with or without priorities). The methods here are the plain paths: they know
    no feature. Optional features (TTL, limits, priorities, delivery limit, single active consumer)
    live in the ``features`` component; while the queue uses one (``special``), the component's paths
    are bound on the queue in place of the plain ones, so neither kind of path tests a flag per message.
    """

    kind = "classic"

    def __init__(
        self,
        vhost: QueueHost,
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
        self.index: QueueIndex = index
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.exclusive = exclusive_owner is not None
        self.auto_delete = auto_delete
        self.arguments = arguments or {}
        self.consumers: ConsumerSet = ConsumerSet()
        self.stats = MessageCounters()
        self.deleted = False
        self.special = False
        self._had_consumer = False
        # Positions to deliver with redelivered=true: requeued ones, and after an unclean stop the
        # messages recovered from disk (their delivery state was not persisted).
        self._redelivered: set[int] = PositionSet()  # (C keys, no object each: a whole window may come back)
        self._recovered_left = index.ready_count if recovered_redelivered else 0
        self._run_limit = FIRST_RUN  # messages per delivery run, from the body sizes seen last
        # Settled here through these, bound by use_features: the index's own, or the component's.
        self._remove: Callable[[int], None] = index.ack
        self._remove_many: Callable[[list[int]], None] = index.ack_many
        self._requeue_many: Callable[[list[int]], None] = self.requeue_ready
        dedup = settings_of(self.arguments)
        if dedup is not None:  # a message with headers then takes the publish path that asks the cache
            self.dedup = (DedupCache(dedup, vhost.store.open_append_file(file_name("q", name)),
                                     (index, vhost.store.messages)) if durable else DedupCache(dedup))
        self.features = QueueFeatures(self, settings)  # sets self.settings, and the paths with use_features
        if self.settings.queue_type == "quorum":
            # A quorum queue is this queue with a default delivery limit (see QueueSettings); it reports
            # its declared type, as RabbitMQ does.
            self.kind = "quorum"

    # --- state --------------------------------------------------------------------------------
    @property
    def message_count(self) -> int:
        # less the messages held for a delayed retry that a restart put back in the ready list
        return self.index.ready_count - len(self.features.held_ready)

    @property
    def unacked_count(self) -> int:
        return self.index.unacked_count

    def persistent_count(self) -> int:
        # all but the ones published non-persistent in a durable queue; none in a transient queue
        if not self.durable:
            return 0
        return self.index.ready_count + self.index.unacked_count - self.index.transient_count

    def memory_bytes(self) -> int:
        return self.index.memory_bytes()

    def head_position(self) -> int | None:
        return self.index.peek()

    def peek(self, count: int) -> list[tuple[StoredMessage, bool]]:
        """The head's messages with the redelivered flag ``shift`` would give each, nothing changed."""
        out: list[tuple[StoredMessage, bool]] = []
        again, recovered = self._redelivered, self._recovered_left
        read = self.vhost.store.messages.read
        for pos in itertools.islice(iter(self.index), count):
            if pos in again:
                redelivered = True
            elif recovered:
                recovered -= 1
                redelivered = True
            else:
                redelivered = False
            try:
                out.append((read(pos), redelivered))
            except (CorruptRecord, KeyError):
                continue  # peeking changes nothing: the delivery path reports and removes it
        return out

    def redelivered_positions(self) -> list[int]:
        return sorted(self._redelivered)

    def mark_redelivered(self, positions: Iterable[int]) -> None:
        self._redelivered.update(positions)

    def has_exclusive_consumer(self) -> bool:
        return self.consumers.has_exclusive

    # --- settings and timers ------------------------------------------------------------------
    def use_features(self, features: QueueFeatures | None) -> None:
        """Bind the message paths: the component's while the queue uses a feature, else the plain ones.

        The one place that decides: instance attributes shadow the plain methods of the class (the
        publish path reads only ``special``), and no path tests a flag per message.
        """
        self.special = features is not None
        paths = self.__dict__
        if features is not None:
            paths.update(push=features.push, push_many=features.push_many, deliver=features.deliver,
                         refuses=features.refuses, _take_head=features.take_for_get)
            self._remove, self._remove_many, self._requeue_many = (
                features.remove, features.remove_many, features.requeue_many)
        else:
            for name in FEATURE_PATHS:
                paths.pop(name, None)
            self._remove, self._remove_many, self._requeue_many = (
                self.index.ack, self.index.ack_many, self.requeue_ready)

    def route_requeues(self, requeue_many: Callable[[list[int]], None]) -> None:
        """Requeues through ``requeue_many`` while the other paths stay plain (delayed retries alone)."""
        self._requeue_many = requeue_many

    def apply_settings(self, settings: QueueSettings) -> None:
        self.features.apply(settings)

    def enable_message_ttl(self) -> None:
        self.features.enable_message_ttl()

    def touch(self) -> None:
        self.features.touch()

    def start_timers(self) -> None:
        self.features.start_timers()

    def stop_timers(self) -> None:
        self.features.stop_timers()

    # --- messages in --------------------------------------------------------------------------
    def push(self, pos: int, persistent: bool, message: StoredMessage | None = None) -> None:
        index = self.index
        if message is not None and self.consumers and not index.ready_count:
            # Nothing waiting: hand the message in hand straight to a consumer with capacity,
            # instead of reading it back from its segment later. It is stored and indexed all the same.
            consumer = self.consumers.next_ready()
            if consumer is not None:
                self._hand(consumer, pos, persistent, message)
                return
        index.push(pos, persistent)
        if self.consumers.step_wanted():
            self.vhost.schedule_delivery(self)

    def push_many(self, positions: array, persistent: bool, run: PublishRun, first: int,
                  level: int | None = None) -> None:
        """``push`` for a run: waiting consumers take messages in hand, the rest enter the index at
        once (``level``: the priority of every one of them, for a priority index)."""
        index = self.index
        consumers = self.consumers
        handed = 0
        if consumers and not index.ready_count:
            count = len(positions)
            if len(consumers) == 1:  # no round robin to keep: as many as its windows allow, as one run
                handed = self._hand_run(next(iter(consumers)), positions, persistent, run, first, level)
            elif not self.vhost.channel_wide_prefetches:
                handed = self._hand_rounds(positions, persistent, run, first, level)
            else:  # a pick must see the deliveries before it on its channel: one at a time
                handed = self._hand_each(positions, persistent, run, first)
            if handed == count:
                return
            positions = positions[handed:]
        index.push_many(positions, persistent, level)
        if consumers.step_wanted():
            self.vhost.schedule_delivery(self)

    def push_runs(self, positions: array, persistent: bool, run: PublishRun, first: int, level: int | None) -> None:
        """The plain ``push_many``, for the feature component while no feature needs a step per message."""
        Queue.push_many(self, positions, persistent, run, first, level)

    def _hand_each(self, positions: array, persistent: bool, run: PublishRun, first: int) -> int:
        """The head of a published run straight to consumers with capacity (nothing is ready), one
        message at a time in round-robin order; returns how many they took."""
        next_ready = self.consumers.next_ready
        count = len(positions)
        handed = 0
        messages = run.messages(first, count)
        while handed < count:  # as push(): straight to consumers with capacity, nothing read back
            consumer = next_ready()
            if consumer is None:
                break
            self._hand(consumer, positions[handed], persistent, messages[handed])
            handed += 1
        return handed

    def _hand(self, consumer: QueueConsumer, pos: int, persistent: bool, message: StoredMessage) -> None:
        """One stored message straight to ``consumer`` (nothing ready before it)."""
        self._recovered_left = 0
        if consumer.no_ack:
            # Delivered and settled at once: the index would only add and remove it.
            consumer.channel.deliver(consumer, pos, message, False)
            return
        index = self.index
        index.push(pos, persistent)
        index.shift()
        consumer.channel.deliver(consumer, pos, message, False)
        consumer.unacked += 1

    def _hand_rounds(self, positions: array, persistent: bool, run: PublishRun, first: int,
                     level: int | None = None) -> int:
        """``_hand_each`` as runs: the round robin picks each message's consumer as there, then the
        picked head of the run enters the index and leaves it in one call each, and every consumer's
        share goes to its channel as delivery runs (one booking and one frame build per run, not per
        message). Only without channel-wide prefetches (a pick cannot see the picks before it on its
        channel); returns how many the consumers took."""
        picks, no_ack = self.consumers.pick(len(positions))
        handed = len(picks)
        if not handed:
            return 0
        self._recovered_left = 0
        index = self.index
        if not no_ack:
            index.push_many(positions[:handed] if handed < len(positions) else positions, persistent, level)
            taken = index.shift_many(handed)  # the same positions: nothing else was ready
        else:
            taken = positions[:handed].tolist()
            if no_ack < handed:  # the no-ack ones are delivered and settled at once: never indexed
                kept = array("Q", [pos for pos, consumer in zip(taken, picks, strict=True) if not consumer.no_ack])
                index.push_many(kept, persistent, level)
                index.shift_many(len(kept))
        deliver_picks(picks, taken, run.messages(first, handed), None)
        return handed

    def _hand_run(self, consumer: QueueConsumer, positions: array, persistent: bool, run: PublishRun,
                  first: int, level: int | None = None) -> int:
        """The head of a published run straight to the queue's one consumer (nothing is ready), as
        many as both prefetch windows allow; returns how many it took."""
        channel = consumer.channel
        if not channel.can_deliver():
            return 0
        count = min(len(positions), channel.delivery_room())
        if not consumer.no_ack and consumer.prefetch:
            count = min(count, consumer.prefetch - consumer.unacked)
        if count <= 0:
            return 0
        self._recovered_left = 0
        messages = run.messages(first, count)
        if consumer.no_ack:  # delivered and settled at once: the index would only add and remove them
            channel.deliver_run(consumer, list(positions[:count]), messages, None)
            return count
        index = self.index
        index.push_many(positions[:count], persistent, level)
        channel.deliver_run(consumer, index.shift_many(count), messages, None)
        consumer.unacked += count
        return count

    # --- messages out -------------------------------------------------------------------------
    def shift(self) -> tuple[int, bool] | None:
        """Take the head for delivery (it becomes unacked): (position, redelivered), or None."""
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

    def _take_head(self) -> tuple[int, StoredMessage, bool] | None:
        """The head, read (a damaged one is reported by read(), removed, and the next one tried)."""
        while True:
            shifted = self.shift()
            if shifted is None:
                return None
            pos, redelivered = shifted
            msg = self.read(pos)
            if msg is not None:
                return pos, msg, redelivered
            self.index.ack(pos)

    def get(self) -> tuple[int, StoredMessage, bool] | None:
        """basic.get: the head message (now unacked), or None."""
        self.touch()
        taken = self._take_head()
        if taken is None:
            self.vhost.node_counters.get_empty += 1  # RabbitMQ's messages_get_empty_total
        return taken

    def deliver(self) -> bool:
        """Deliver ready messages to consumers with capacity; True if more could go out now."""
        budget = DELIVERY_BATCH
        index = self.index
        consumers = self.consumers
        if len(consumers) == 1:  # every delivery in a run: each costs a RUN_SHARE-th of the budget
            return self._deliver_to(next(iter(consumers)), budget * RUN_SHARE)
        # Every channel-wide prefetch must have room for the whole budget; with none in the vhost (the
        # usual case) the walk over every consumer (a third of the loop at 1,000 consumers) is skipped.
        if consumers and not self.vhost.channel_wide_prefetches:  # each consumer's share of a round is a run
            return self._deliver_rounds(budget * RUN_SHARE)
        if consumers and all(c.channel.delivery_room() >= budget for c in consumers):
            return self._deliver_rounds(budget)
        while budget and index.ready_count and consumers:
            consumer = consumers.next_ready()
            if consumer is None:
                break
            shifted = self.shift()
            if shifted is None:
                break
            pos, redelivered = shifted
            msg = self.read(pos)
            if msg is None:  # damaged: reported by read(); removed, and the rest goes on
                index.ack(pos)
                continue
            consumer.channel.deliver(consumer, pos, msg, redelivered)
            if not consumer.no_ack:
                consumer.unacked += 1
            else:
                index.ack(pos)
            budget -= 1
        return budget == 0

    def deliver_runs(self) -> bool:
        """The plain ``deliver``, for the feature component while no feature needs a step per message."""
        return Queue.deliver(self)

    def _deliver_to(self, consumer: QueueConsumer, budget: int) -> bool:
        """``deliver`` with one consumer and no features, a run at a time: as many positions as the
        budget and both prefetch windows allow leave the index in one call, are read, and go to the
        channel as one run (one bookkeeping step and one output append per run). A channel with its
        own ``deliver_from_queue`` takes the whole step (sizing its runs by its window, ``take_run``)
        while no redelivery flag is pending; it answers None to leave the step to this loop."""
        channel = consumer.channel
        own_step = getattr(channel, "deliver_from_queue", None)
        if own_step is not None and not (self._redelivered or self._recovered_left):
            delivered = own_step(self, consumer, budget)
            if delivered is not None:
                return delivered == budget
        index = self.index
        no_ack = consumer.no_ack
        prefetch = 0 if no_ack else consumer.prefetch
        stored_run = stored_run_of(consumer)  # an acking AMQP consumer's runs: framed from the segments
        while budget and index.ready_count and channel.can_deliver():
            count = min(budget, index.ready_count, channel.delivery_room(), self._run_limit)
            if prefetch:
                count = min(count, prefetch - consumer.unacked)
            if count <= 0:
                break
            if stored_run is not None:
                if not (taken := index.shift_many(count)):
                    break
                flags = self._redelivered_flags(taken) if self._redelivered or self._recovered_left else None
                count, first_size, last_size = deliver_stored(self, stored_run, consumer, taken, flags)
                budget -= count
                consumer.unacked += count
                if count:  # the next run's length as take_run sizes it
                    self._run_limit = max(1, RUN_BYTES // ((first_size + last_size) // 2 + 64))
                continue
            positions, messages, redelivered = self.take_run(count)
            if not positions:
                break
            budget -= len(positions)
            channel.deliver_run(consumer, positions, messages, redelivered)
            if no_ack:
                index.ack_many(positions)
            else:
                consumer.unacked += len(positions)
        return budget == 0

    def take_run(self, count: int) -> tuple[list[int], list[StoredMessage], list[bool] | None]:
        """Up to ``count`` ready messages (no more than the run length the last bodies allow) taken
        from the index as one run and read: their positions (now unacked), messages and redelivered
        flags (None: none redelivered). Damaged records are reported and removed, the rest kept (the
        next run tried when all were)."""
        while True:
            positions = self.index.shift_many(min(count, self._run_limit))
            if not positions:
                return positions, [], None
            redelivered = self._redelivered_flags(positions) if self._redelivered or self._recovered_left else None
            try:
                messages = self.vhost.store.messages.read_many(positions)
                break
            except (CorruptRecord, KeyError):
                positions, messages, redelivered = readable(self, positions, redelivered)
                if positions:
                    break
        # the next run's length from this one's body sizes (first and last: no per-message step)
        sampled = (len(messages[0].body) + len(messages[-1].body)) // 2 + 64
        self._run_limit = max(1, RUN_BYTES // sampled)
        return positions, messages, redelivered

    def _deliver_rounds(self, budget: int) -> bool:
        """``deliver`` with several consumers: the round robin picks each message's consumer as the
        loop above does, then the picked positions leave the index in one call, are read at once and
        go to each consumer as one run. Only while every channel-wide prefetch has room for the whole
        budget (a pick cannot see the picks before it on its channel)."""
        index = self.index
        picks, single = pick_round(self.consumers, min(budget, index.ready_count))
        positions = taken = index.shift_many(len(picks))
        if len(positions) < len(picks):  # cannot happen (ready_count bounded the picks); undo the rest
            for consumer in picks[len(positions):]:
                if not consumer.no_ack:
                    consumer.credit(1)
            del picks[len(positions):]
        if not positions:
            return False
        picked = len(picks)
        redelivered = self._redelivered_flags(positions) if self._redelivered or self._recovered_left else None
        if deliver_stored_round(self, picks, single, positions, redelivered):  # acking AMQP consumers' shares
            return picked == budget
        try:
            messages = list(self.vhost.store.messages.read_many(positions))
        except (CorruptRecord, KeyError):  # read_many raises rather than return a damaged record
            picks, positions, messages, redelivered = self._read_damaged(picks, positions, redelivered)
        if single and picks:  # one consumer's round (the usual one an ack read starts): one run, no split
            delivered = deliver_share(picks[0], positions, messages, redelivered)
        else:
            if len(owners := dict.fromkeys(picks)) > 1:  # each one's share its own run: its in-order acks settle it
                index.split_taken(taken, shares_of(owners, picks, positions))
            delivered = deliver_picks(picks, positions, messages, redelivered)
        for settled in delivered:
            index.ack_many(settled)  # delivered to no-ack consumers: settled at once
        return picked == budget

    def _read_damaged(self, picks: list[QueueConsumer], positions: list[int], redelivered: list[bool] | None
                      ) -> tuple[list[QueueConsumer], list[int], list[StoredMessage], list[bool] | None]:
        """A round's positions read one at a time (one is damaged): the damaged ones reported (``read``) and
        removed, their consumer's turn given back, the rest kept (the compiled refill's step too)."""
        read = [self.read(pos) for pos in positions]
        kept = [i for i, msg in enumerate(read) if msg is not None]
        for i, msg in enumerate(read):
            if msg is None:
                self.index.ack(positions[i])
                if not picks[i].no_ack:
                    picks[i].credit(1)
        messages = [msg for msg in read if msg is not None]
        if redelivered is not None:
            redelivered = [redelivered[i] for i in kept]
        return [picks[i] for i in kept], [positions[i] for i in kept], messages, redelivered

    def _redelivered_flags(self, positions: list[int]) -> list[bool]:
        """The redelivered flag of each shifted position, as ``shift`` decides it one at a time."""
        again = self._redelivered
        if again.issuperset(positions):  # a run of requeued ones (a closed channel's window coming back)
            again.difference_update(positions)
            return [True] * len(positions)
        flags = []
        for pos in positions:
            if pos in again:
                again.discard(pos)
                flags.append(True)
            elif self._recovered_left:
                self._recovered_left -= 1
                flags.append(True)
            else:
                flags.append(False)
        return flags

    # --- acknowledgements ---------------------------------------------------------------------
    def ack(self, pos: int) -> None:
        if not self.deleted:
            self._remove(pos)

    def ack_many(self, positions: list[int]) -> None:
        if not self.deleted:
            self._remove_many(positions)

    def requeue(self, pos: int) -> None:
        self.requeue_many([pos])

    def requeue_many(self, positions: list[int]) -> None:
        """Back to the queue (nack/reject with requeue, a closing channel's deliveries): the plain path
        in one index call for all (``requeue_ready``), a feature's path a message at a time."""
        if not self.deleted:
            self._requeue_many(positions)
            if self.consumers:
                self.vhost.schedule_delivery(self)

    def requeue_failed(self, pos: int) -> None:
        """basic.reject with requeue: as ``requeue``, but a delayed retry of type ``failed`` applies."""
        if self.deleted:
            return
        if self.special or self.features.retry is not None:
            self.features.requeue(pos, True)
        else:
            self.requeue_ready([pos])
        if self.consumers:
            self.vhost.schedule_delivery(self)

    @property
    def delayed_count(self) -> int:
        """Messages held for a delayed retry (counted in ``unacked_count`` too)."""
        return len(self.features.held_due)

    def peek_delayed(self, count: int) -> list[tuple[StoredMessage, int]]:
        return self.features.peek_held(count)

    def requeue_ready(self, positions: list[int]) -> None:
        """Back to the head, delivered next with redelivered=true."""
        self.index.requeue_many(positions)
        self._redelivered.update(positions)

    def reject(self, pos: int) -> None:
        if not self.deleted:
            self.features.reject(pos)

    def purge(self) -> int:
        count = self.index.purge()
        count += self.features.purged()
        self._recovered_left = 0
        return count

    # --- consumers ----------------------------------------------------------------------------
    def add_consumer(self, consumer: QueueConsumer) -> None:
        self.consumers.add(consumer)
        self._had_consumer = True
        self.touch()
        self.vhost.schedule_delivery(self)

    def remove_consumer(self, consumer: QueueConsumer, *, notify: bool = False) -> None:
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
        if self.dedup is not None and self.durable:
            self.vhost.store.delete_append_file(file_name("q", self.name))
        return count

    def take_one(self) -> tuple[int, StoredMessage, bool] | None:
        """``take_run`` of one (a window freed by one ack), with no run's list or length sampling."""
        if self._redelivered or self._recovered_left:
            return self._take_head()
        while (pos := self.index.shift()) is not None:
            if (msg := self.read(pos)) is not None:  # a damaged one is reported by read(), then removed
                return pos, msg, False
            self.index.ack(pos)
        return None


def _cancel_consumers(consumers: ConsumerSet) -> None:
    for consumer in consumers:
        consumer.channel.consumer_cancelled(consumer)
