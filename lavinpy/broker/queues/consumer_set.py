"""A classic queue's consumers: O(1) add and remove, round-robin without scanning the others.

Thousands of consumers on one queue must not make each basic.consume or basic.cancel walk all of
them: registration order (single active consumer, iteration) is one dict, the round-robin ring
another (the consumer served goes to its end), and the priorities and exclusive flags are counted.

Nor must each delivery walk the consumers whose own prefetch window is full (with 1,000 consumers
at prefetch 10 nearly all of them are, most of the time): each consumer's place in the ring is a
serial number (its turn); a consumer found with its window full is parked until its next credit
(``Consumer.credit``, the only step that lowers its unacked count) puts it back with its old turn.
The consumers not parked are a queue in turn order (the one served goes to its end, as in the ring)
and a small heap of those back from parking (whose turns are older than the queue's newer ones):
the next one served is the earlier of the two heads, so the order served is the ring's, as when
every consumer was looked at in turn.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from heapq import heappop, heappush
from typing import TYPE_CHECKING

from ...wire.accel import cwire

if TYPE_CHECKING:
    from ...store.record import StoredMessage
    from .queue_consumer import QueueConsumer


class ConsumerSet:
    __slots__ = ("_order", "_ring", "_priorities", "_exclusive", "_turns", "_queue", "_back", "_next_turn",
                 "_fast_valid")

    def __init__(self) -> None:
        self._order: dict[QueueConsumer, None] = {}
        # The ring while priorities differ (all consumers in turn order, scanned); otherwise the
        # queue and heap below stand for it.
        self._ring: OrderedDict[QueueConsumer, None] = OrderedDict()
        self._priorities: dict[int, int] = {}  # priority -> number of consumers with it
        self._exclusive = 0
        # The ring as turns: a consumer's turn is the serial of its last move to the ring's end.
        self._turns: dict[QueueConsumer, int] = {}
        # The consumers not parked: served (or added) since they were last back from parking, in
        # turn order; and those back from parking as (turn, consumer), a heap. A heap entry whose
        # consumer was removed since is stale and dropped when it comes up.
        self._queue: OrderedDict[QueueConsumer, None] = OrderedDict()
        self._back: list[tuple[int, QueueConsumer]] = []
        self._next_turn = 0
        self._fast_valid = True  # False after priorities differed (the ring was scanned instead)

    def __len__(self) -> int:
        return len(self._order)

    def __bool__(self) -> bool:
        return bool(self._order)

    def step_wanted(self) -> bool:
        """Whether a message entering the ready index asks for a delivery step: any consumer, but a
        lone one with its prefetch window full (a publisher's flood to a subscriber at its window):
        its next credit asks for the step (every settle schedules a queue with messages)."""
        order = self._order
        if len(order) != 1:
            return bool(order)
        for consumer in order:
            return consumer.no_ack or not consumer.prefetch or consumer.unacked < consumer.prefetch
        return False  # pragma: no cover - one consumer in the dict

    def __iter__(self) -> Iterator[QueueConsumer]:
        """Registration order."""
        return iter(self._order)

    def __contains__(self, consumer: object) -> bool:
        return consumer in self._order

    def add(self, consumer: QueueConsumer) -> None:
        self._order[consumer] = None
        self._turns[consumer] = self._next_turn
        self._next_turn += 1
        if self._fast_valid:
            self._queue[consumer] = None
        else:
            self._ring[consumer] = None
        consumer.parked = None
        priorities = self._priorities
        priorities[consumer.priority] = priorities.get(consumer.priority, 0) + 1
        if consumer.exclusive:
            self._exclusive += 1

    def remove(self, consumer: QueueConsumer) -> bool:
        """False when the consumer was not here."""
        if consumer not in self._order:
            return False
        del self._order[consumer]
        del self._turns[consumer]  # a heap entry of it is stale from now on
        self._queue.pop(consumer, None)
        self._ring.pop(consumer, None)
        consumer.parked = None
        if self._fast_valid and len(self._back) > 2 * len(self._turns) + 64:
            self._rebuild()  # many stale heap entries
        priorities = self._priorities
        left = priorities[consumer.priority] - 1
        if left:
            priorities[consumer.priority] = left
        else:
            del priorities[consumer.priority]
        if consumer.exclusive:
            self._exclusive -= 1
        return True

    def first(self) -> QueueConsumer | None:
        """The earliest registered consumer (the single active consumer)."""
        for consumer in self._order:
            return consumer
        return None

    @property
    def priorities_differ(self) -> bool:
        """Whether the consumers have more than one priority (x-priority)."""
        return len(self._priorities) > 1

    @property
    def has_exclusive(self) -> bool:
        return self._exclusive > 0

    def next_ready(self) -> QueueConsumer | None:
        """The next consumer with capacity in round-robin order; the highest priority wins when
        priorities differ. The one chosen goes to the end of the ring."""
        if len(self._priorities) > 1:
            return self._next_by_priority()
        if self._back or not self._fast_valid:
            return self._next_merged()
        # Nothing back from parking: the queue's first consumer with capacity.
        queue = self._queue
        parked: list[QueueConsumer] | None = None
        chosen: QueueConsumer | None = None
        for consumer in queue:
            if consumer.can_accept():
                chosen = consumer
                break
            if not consumer.no_ack and consumer.prefetch and consumer.unacked >= consumer.prefetch:
                consumer.parked = self  # its own window is full: back at its next credit
                if parked is None:
                    parked = []
                parked.append(consumer)
        if parked is not None:
            for consumer in parked:
                del queue[consumer]
        if chosen is not None:
            queue.move_to_end(chosen)
            self._turns[chosen] = self._next_turn
            self._next_turn += 1
        return chosen

    def pick(self, limit: int) -> tuple[list[QueueConsumer], int]:
        """Up to ``limit`` consumers in round-robin order, one per message, as ``next_ready`` gives them
        one delivery at a time (each pick counted in its window at once, so the next pick sees it), and
        how many of them are no-ack. The caller delivers message ``i`` to the ``i``-th (``deliver_picks``).

        One pass over the ring, not a ``next_ready`` per message: while a pick runs no channel changes,
        so one delivery at a time serves the consumers with room in turn order, each once per round,
        until a window fills; the rounds are built from each consumer's room (``_sweeps``)."""
        if limit <= 0:
            return [], 0
        if len(self._priorities) > 1:
            return self._pick_by_priority(limit)
        if not self._fast_valid:
            self._rebuild()
        queue = self._queue
        back = self._back
        turns = self._turns
        active: list[QueueConsumer] = []  # those with room, in turn order
        rooms: list[int] = []
        from_back: set[QueueConsumer] = set()
        parked: list[QueueConsumer] | None = None
        skipped: list[tuple[int, QueueConsumer]] | None = None
        if not back:  # nothing back from parking (the common case): the queue's order alone
            active, rooms = _scan(queue, limit, self)
        else:
            consumers = iter(queue)
            head = next(consumers, None)
            while len(active) < limit:
                while back and turns.get(back[0][1]) != back[0][0]:
                    heappop(back)  # stale: removed since
                if back and (head is None or back[0][0] < turns[head]):
                    consumer = back[0][1]
                    backed = True
                elif head is not None:
                    consumer = head
                    backed = False
                    head = next(consumers, None)
                else:
                    break
                if consumer.no_ack or not consumer.prefetch:
                    room = limit
                else:
                    room = consumer.prefetch - consumer.unacked
                    if room <= 0:  # its own window is full: back at its next credit
                        consumer.parked = self
                        if backed:
                            heappop(back)
                        else:
                            if parked is None:
                                parked = []
                            parked.append(consumer)
                        continue
                if backed:
                    entry = heappop(back)
                if not consumer.channel.can_deliver():  # its channel cannot take it now: next time
                    if backed:
                        if skipped is None:
                            skipped = []
                        skipped.append(entry)
                    continue
                if backed:
                    from_back.add(consumer)
                active.append(consumer)
                rooms.append(room)
        if parked is not None:
            for consumer in parked:
                del queue[consumer]
        if skipped is not None:
            for entry in skipped:
                heappush(back, entry)
        if not active:
            return [], 0
        picks, taken = _sweeps(active, rooms, limit)
        # to the ring's end in the order of each one's last pick, as one at a time moves them
        next_turn = self._next_turn
        no_ack = 0
        for consumer, count in taken:
            if consumer in from_back:
                queue[consumer] = None
            else:
                queue.move_to_end(consumer)
            turns[consumer] = next_turn
            next_turn += 1
            if consumer.no_ack:
                no_ack += count
            else:
                consumer.unacked += count
        self._next_turn = next_turn
        return picks, no_ack

    def _pick_by_priority(self, limit: int) -> tuple[list[QueueConsumer], int]:
        """``pick`` while priorities differ: the consumers of the highest priority with room take the
        round as the sweeps share it among them, in ring order; once all their windows are full, those
        of the next priority take the rest, and so on: what one ``next_ready`` per message gives (it
        picks the highest priority with room, round robin within it), with one pass over the ring."""
        if self._fast_valid:
            self._ring_from_turns()
        levels: dict[int, list[QueueConsumer]] = {}
        for consumer in self._ring:
            if consumer.no_ack or not consumer.prefetch or consumer.unacked < consumer.prefetch:
                level = levels.get(consumer.priority)
                if level is None:
                    levels[consumer.priority] = [consumer]
                else:
                    level.append(consumer)
        picks: list[QueueConsumer] = []
        no_ack = 0
        ring = self._ring
        turns = self._turns
        for priority in sorted(levels, reverse=True):  # channels asked only at the levels the round reaches
            left = limit - len(picks)
            active = [consumer for consumer in levels[priority] if consumer.channel.can_deliver()]
            rooms = [left if consumer.no_ack or not consumer.prefetch else consumer.prefetch - consumer.unacked
                     for consumer in active]
            level_picks, taken = _sweeps(active, rooms, left)
            picks += level_picks
            for consumer, count in taken:  # to the ring's end in the order of each one's last pick
                ring.move_to_end(consumer)
                turns[consumer] = self._next_turn
                self._next_turn += 1
                if consumer.no_ack:
                    no_ack += count
                else:
                    consumer.unacked += count
            if len(picks) >= limit:
                break
        return picks, no_ack

    def _next_merged(self) -> QueueConsumer | None:
        """next_ready with consumers back from parking: the earlier of the queue's and the heap's heads."""
        if not self._fast_valid:
            self._rebuild()
        queue = self._queue
        back = self._back
        turns = self._turns
        parked: list[QueueConsumer] | None = None
        skipped: list[tuple[int, QueueConsumer]] | None = None
        chosen: QueueConsumer | None = None
        from_back = False
        consumers = iter(queue)
        head = next(consumers, None)
        while True:
            while back and turns.get(back[0][1]) != back[0][0]:
                heappop(back)  # stale: removed since
            if back and (head is None or back[0][0] < turns[head]):
                consumer = back[0][1]
                from_back = True
            elif head is not None:
                consumer = head
                from_back = False
            else:
                break
            if consumer.can_accept():
                chosen = consumer
                break
            if not consumer.no_ack and consumer.prefetch and consumer.unacked >= consumer.prefetch:
                consumer.parked = self  # its own window is full: back at its next credit
                if from_back:
                    heappop(back)
                else:
                    if parked is None:
                        parked = []
                    parked.append(consumer)
                    head = next(consumers, None)
            elif from_back:  # its channel cannot take it now (flow, channel prefetch, output): next time
                if skipped is None:
                    skipped = []
                skipped.append(heappop(back))
            else:
                head = next(consumers, None)
        if parked is not None:
            for consumer in parked:
                del queue[consumer]
        if chosen is not None:
            if from_back:
                heappop(back)
                queue[chosen] = None
            else:
                queue.move_to_end(chosen)
            turns[chosen] = self._next_turn
            self._next_turn += 1
        if skipped is not None:
            for entry in skipped:
                heappush(back, entry)
        return chosen

    def unpark(self, consumer: QueueConsumer) -> None:
        """A parked consumer got credit back: served again at its place in the ring."""
        consumer.parked = None
        turn = self._turns.get(consumer)
        if turn is not None and self._fast_valid:
            heappush(self._back, (turn, consumer))

    def _ring_from_turns(self) -> None:
        """The ring from the turns, for the priority picks; the queue is rebuilt when priorities agree again."""
        turns = self._turns
        self._ring = OrderedDict.fromkeys(sorted(turns, key=turns.__getitem__))
        self._queue = OrderedDict()
        self._back = []
        self._fast_valid = False

    def _next_by_priority(self) -> QueueConsumer | None:
        if self._fast_valid:
            self._ring_from_turns()
        chosen: QueueConsumer | None = None
        top = max(self._priorities)
        for consumer in self._ring:  # the first with room of the highest priority with room
            if chosen is not None and consumer.priority <= chosen.priority:
                continue  # cannot take its place: not asked
            if consumer.can_accept():
                chosen = consumer
                if consumer.priority == top:
                    break  # none comes higher
        if chosen is not None:
            self._ring.move_to_end(chosen)
            self._turns[chosen] = self._next_turn
            self._next_turn += 1
        return chosen

    def _rebuild(self) -> None:
        turns = self._turns
        for consumer in turns:
            consumer.parked = None
        self._queue = OrderedDict.fromkeys(sorted(turns, key=turns.__getitem__))
        self._ring = OrderedDict()
        self._back = []
        self._fast_valid = True


def _scan_py(queue: OrderedDict[QueueConsumer, None], limit: int, owner: ConsumerSet
             ) -> tuple[list[QueueConsumer], list[int]]:
    """``pick``'s walk of the consumers in turn order while none is back from parking: up to ``limit``
    of those with room whose channel can deliver now, and each one's room; those whose own window is
    full are parked (taken out of ``queue``). The pure twin of _cwire_pick.c's ``pick_scan``."""
    active: list[QueueConsumer] = []
    rooms: list[int] = []
    parked: list[QueueConsumer] | None = None
    for consumer in queue:
        if consumer.no_ack or not consumer.prefetch:
            room = limit
        else:
            room = consumer.prefetch - consumer.unacked
            if room <= 0:  # its own window is full: back at its next credit
                consumer.parked = owner
                if parked is None:
                    parked = []
                parked.append(consumer)
                continue
        if consumer.channel.can_deliver():  # else its channel cannot take it now: next time
            active.append(consumer)
            rooms.append(room)
            if len(active) == limit:
                break
    if parked is not None:
        for consumer in parked:
            del queue[consumer]
    return active, rooms


_scan = cwire.pick_scan if cwire is not None else _scan_py


def _sweeps(active: list[QueueConsumer], rooms: list[int], limit: int
            ) -> tuple[list[QueueConsumer], list[tuple[QueueConsumer, int]]]:
    """Up to ``limit`` picks from the consumers with room, in turn order (``rooms`` each one's room):
    round after round each takes one in the same order, until its room is used up; as many whole rounds
    as every room and the limit allow are added at once. Also each consumer picked with its count, in the
    order of its last pick (the ring's new order), found from the rounds rather than by a pass over the
    picks: those whose room a stretch of rounds used up took their last pick in its last round, before
    the next stretch; a part round at the end comes after the last full round."""
    if len(active) >= limit:
        return active[:limit], [(consumer, 1) for consumer in active[:limit]]
    picks: list[QueueConsumer] = []
    taken: list[tuple[QueueConsumer, int]] = []
    counts = [0] * len(active)
    last_round: list[tuple[QueueConsumer, int]] | None = None  # the last stretch's, if it used up a room
    dropped: list[tuple[QueueConsumer, int]] = []  # those whose room it used up
    while active:
        left = limit - len(picks)
        if len(active) >= left:  # a part round (every consumer still here took one in the round before)
            head = active[:left]
            picks.extend(head)
            if last_round is None:
                taken += zip(active[left:], counts[left:], strict=True)
            else:
                heads = set(head)
                taken += [(consumer, count) for consumer, count in last_round if consumer not in heads]
            taken += [(consumer, count + 1) for consumer, count in zip(head, counts[:left], strict=True)]
            return picks, taken
        if last_round is not None:
            taken += dropped
            last_round, dropped = None, []
        least = min(rooms)
        rounds = min(least, left // len(active))
        picks.extend(active * rounds)
        counts = [count + rounds for count in counts]
        if least > rounds:
            rooms = [room - rounds for room in rooms]
            continue
        last_round = list(zip(active, counts, strict=True))
        dropped = [last_round[i] for i, room in enumerate(rooms) if room <= rounds]
        kept = [i for i, room in enumerate(rooms) if room > rounds]
        active = [active[i] for i in kept]
        rooms = [rooms[i] - rounds for i in kept]
        counts = [counts[i] for i in kept]
    taken += dropped
    return picks, taken


def whole_rounds(picks: list[QueueConsumer], width: int) -> bool:
    """Whether the picks go round the ``width`` distinct consumers of the first ``width`` picks again and
    again (and part of a round): pick ``i`` is ``picks[i % width]``. Two list comparisons at C speed."""
    return picks[width:] == picks[:-width] and len(set(picks[:width])) == width


def deliver_picks(picks: list[QueueConsumer], positions: list[int], messages: list[StoredMessage],
                  redelivered: list[bool] | None) -> list[list[int]]:
    """Deliver message ``i`` (at ``positions[i]``) to ``picks[i]`` as delivery runs, one per consumer, so
    a consumer's share of a round costs one booking and one frame build (on a channel of its own, the
    tags and frames one delivery at a time would give it). Returns the positions delivered to no-ack
    consumers, a list per run."""
    if not picks:
        return []
    consumers = list(dict.fromkeys(picks))
    width = len(consumers)
    deliver_round = getattr(consumers[0].channel, "deliver_round", None)
    if width == len(picks) or whole_rounds(picks, width):
        # Whole rounds (and a part of one) of the same consumers (``_sweeps``' common case): message
        # ``i`` goes to ``consumers[i % width]``, every consumer's share one run.
        if deliver_round is not None and (width == len(picks)
                                          or len({consumer.channel for consumer in consumers}) == width):
            # the channel kind books and frames the round in one call (consumers that share a channel
            # take their shares one after the other: one run each, as below)
            return deliver_round(consumers, positions, messages, redelivered)
        return deliver_round_runs(consumers, positions, messages, redelivered)
    if deliver_round is not None:
        # Uneven picks (the consumers' room differs): the channel kind may book and frame them in one
        # call too when each consumer is on a channel of its own (one stretch a channel, as below);
        # None: it did nothing.
        delivered: list[list[int]] | None = deliver_round(consumers, positions, messages, redelivered, picks)
        if delivered is not None:
            return delivered
    return _deliver_stretches(picks, positions, messages, redelivered)


def deliver_round_runs(consumers: list[QueueConsumer], positions: list[int], messages: list[StoredMessage],
                       redelivered: list[bool] | None) -> list[list[int]]:
    """Message ``i`` to ``consumers[i % len(consumers)]`` (distinct), each consumer's share as one run
    through its channel's ``deliver_run``, in the order of ``consumers`` (those sharing a channel take
    their shares there one after the other). Returns the positions delivered to no-ack consumers, a list
    per run."""
    no_ack_runs: list[list[int]] = []
    width = len(consumers)
    for j, consumer in enumerate(consumers):
        run_positions = positions[j::width]
        consumer.channel.deliver_run(consumer, run_positions, messages[j::width],
                                     None if redelivered is None else redelivered[j::width])
        if consumer.no_ack:
            no_ack_runs.append(run_positions)
    return no_ack_runs


def _deliver_stretches(picks: list[QueueConsumer], positions: list[int], messages: list[StoredMessage],
                       redelivered: list[bool] | None) -> list[list[int]]:
    """``deliver_picks`` of any picks: each consumer's as one run, in the order of the consumers' first
    picks. Consumers that share a channel then get their shares one after the other there, each in the
    queue's order, where the round robin's order made runs of one message (a booking, a frame build and
    an ack span each): AMQP orders a consumer's deliveries, not those of a channel's several consumers."""
    no_ack_runs: list[list[int]] = []
    shares: dict[QueueConsumer, list[int]] = {}
    for i, consumer in enumerate(picks):
        share = shares.get(consumer)
        if share is None:
            shares[consumer] = [i]
        else:
            share.append(i)
    for consumer, picked in shares.items():
        if len(picked) == 1:
            i = picked[0]
            run_positions, run_messages = [positions[i]], [messages[i]]
            flags = None if redelivered is None else [redelivered[i]]
        else:
            run_positions = [positions[i] for i in picked]
            run_messages = [messages[i] for i in picked]
            flags = None if redelivered is None else [redelivered[i] for i in picked]
        consumer.channel.deliver_run(consumer, run_positions, run_messages, flags)
        if consumer.no_ack:
            no_ack_runs.append(run_positions)
    return no_ack_runs
