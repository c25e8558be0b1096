"""The consumer set's round robin: consumers parked with a full window are served in the same order as
when every consumer was looked at in turn (the reference scan below), whatever the credits, channel
blocks, priorities, adds and removes."""

from __future__ import annotations

import random
from collections import OrderedDict
from typing import Any

import pytest

from lavinpy.broker.queues.consumer import Consumer
from lavinpy.broker.queues.consumer_set import ConsumerSet
from lavinpy.broker.queues.round_picks import pick_round


class Channel:
    """The part of a channel a queue asks before delivering: open or blocked (flow, output, channel prefetch)."""

    def __init__(self) -> None:
        self.open = True

    def can_deliver(self) -> bool:
        return self.open


class ReferenceRing:
    """Every consumer looked at in ring order, the one served moved to the end."""

    def __init__(self) -> None:
        self.ring: OrderedDict[Consumer, None] = OrderedDict()

    def next_ready(self) -> Consumer | None:
        priorities = {c.priority for c in self.ring}
        chosen = None
        for c in self.ring:
            if c.can_accept() and (chosen is None or (len(priorities) > 1 and c.priority > chosen.priority)):
                chosen = c
                if len(priorities) <= 1:
                    break
        if chosen is not None:
            self.ring.move_to_end(chosen)
        return chosen


@pytest.mark.parametrize("seed", range(12))
def test_same_order_as_scanning_every_consumer(seed: int) -> None:
    rnd = random.Random(seed)
    with_priorities = seed % 3 == 0
    fast, ref = ConsumerSet(), ReferenceRing()
    channels = [Channel() for _ in range(4)]
    live: list[tuple[Consumer, Consumer]] = []  # the same consumer in each set (separate counts)
    made = 0

    def add() -> None:
        nonlocal made
        made += 1
        ch = rnd.choice(channels)
        kw: dict[str, Any] = {"prefetch": rnd.choice([0, 1, 3, 10]), "no_ack": rnd.random() < 0.1,
                              "priority": rnd.choice([0, 5, -3]) if with_priorities else 0}
        a, b = Consumer(f"c{made}", None, ch, **kw), Consumer(f"c{made}", None, ch, **kw)  # type: ignore[arg-type]
        fast.add(a)
        ref.ring[b] = None
        live.append((a, b))

    for _ in range(30):
        add()
    for _step in range(5000):
        r = rnd.random()
        if r < 0.55:
            a, b = fast.next_ready(), ref.next_ready()
            assert (a.tag if a else None) == (b.tag if b else None)
            if a is not None and b is not None:
                a.unacked += 1
                b.unacked += 1
        elif r < 0.85 and live:
            pair = rnd.choice(live)
            if pair[0].unacked:
                n = rnd.randint(1, pair[0].unacked)
                pair[0].credit(n)
                pair[1].credit(n)
        elif r < 0.92:
            ch = rnd.choice(channels)
            ch.open = not ch.open
        elif r < 0.96 and live:
            a, b = live.pop(rnd.randrange(len(live)))
            assert fast.remove(a)
            del ref.ring[b]
            a.credit(a.unacked)  # a late ack of a removed consumer's delivery
        else:
            add()
    assert [c.tag for c in fast] == [a.tag for a, _ in live]


def test_churn_of_consumers_keeps_the_heap_bounded() -> None:
    consumers = ConsumerSet()
    ch = Channel()
    keep = Consumer("keep", None, ch, prefetch=1)  # type: ignore[arg-type]
    consumers.add(keep)
    for i in range(10_000):
        c = Consumer(f"c{i}", None, ch, prefetch=1)  # type: ignore[arg-type]
        consumers.add(c)
        keep.unacked = c.unacked = 1
        assert consumers.next_ready() is None  # both windows full: both parked
        c.credit(1)  # back on the heap
        consumers.remove(c)  # its heap entry is stale from now on
        keep.credit(1)
        assert consumers.next_ready() is keep
    assert len(consumers._back) < 100
    assert list(consumers) == [keep]


@pytest.mark.parametrize("seed", range(12))
def test_pick_is_next_ready_once_per_message(seed: int) -> None:
    """``pick(n)`` (one pass over the ring, whole rounds at once) picks the consumers, and leaves the
    ring, as n calls of the reference scan do, between single deliveries, credits, channel blocks,
    adds and removes."""
    rnd = random.Random(1000 + seed)
    with_priorities = seed % 4 == 0
    fast, ref = ConsumerSet(), ReferenceRing()
    channels = [Channel() for _ in range(5)]
    live: list[tuple[Consumer, Consumer]] = []
    made = 0

    def add() -> None:
        nonlocal made
        made += 1
        ch = rnd.choice(channels)
        kw: dict[str, Any] = {"prefetch": rnd.choice([0, 1, 2, 3, 10, 100]), "no_ack": rnd.random() < 0.1,
                              "priority": rnd.choice([0, 5, -3]) if with_priorities else 0}
        a, b = Consumer(f"c{made}", None, ch, **kw), Consumer(f"c{made}", None, ch, **kw)  # type: ignore[arg-type]
        fast.add(a)
        ref.ring[b] = None
        live.append((a, b))

    for _ in range(rnd.choice([3, 20, 60])):
        add()
    picked = 0
    heap_at_pick: set[bool] = set()  # whether consumers back from parking waited (pick's two paths)
    for _step in range(3000):
        r = rnd.random()
        if r < 0.35:
            limit = rnd.choice([1, 2, 5, 17, 64, 300])
            heap_at_pick.add(bool(fast._back))
            picks, no_ack = fast.pick(limit)
            expected = []
            for _ in range(limit):
                b = ref.next_ready()
                if b is None:
                    break
                if not b.no_ack:
                    b.unacked += 1
                expected.append(b)
            assert [c.tag for c in picks] == [c.tag for c in expected]
            assert no_ack == sum(1 for c in picks if c.no_ack)
            picked += len(picks)
        elif r < 0.45:
            a, b = fast.next_ready(), ref.next_ready()
            assert (a.tag if a else None) == (b.tag if b else None)
            if a is not None and b is not None and not a.no_ack:
                a.unacked += 1
                b.unacked += 1
        elif r < 0.8 and live:
            pair = rnd.choice(live)
            if pair[0].unacked:
                n = rnd.randint(1, pair[0].unacked)
                pair[0].credit(n)
                pair[1].credit(n)
        elif r < 0.9:
            ch = rnd.choice(channels)
            ch.open = not ch.open
        elif r < 0.95 and live:
            a, b = live.pop(rnd.randrange(len(live)))
            assert fast.remove(a)
            del ref.ring[b]
            a.credit(a.unacked)
        else:
            add()
        assert [a.unacked for a, _ in live] == [b.unacked for _, b in live]
    assert picked > 1000  # the picks did run rounds, not only empty sets
    assert with_priorities or heap_at_pick == {False, True}
    assert [c.tag for c in fast] == [a.tag for a, _ in live]


def test_a_step_is_wanted_unless_a_lone_consumer_s_window_is_full() -> None:
    """``step_wanted``: what a push asks before scheduling the queue's delivery step."""
    consumers = ConsumerSet()
    assert not consumers.step_wanted()  # no consumer
    first = Consumer("a", None, Channel(), prefetch=2)  # type: ignore[arg-type]
    consumers.add(first)
    assert consumers.step_wanted()
    first.unacked = 2
    assert not consumers.step_wanted()  # its window full: its next credit asks for the step
    first.credit(1)
    assert consumers.step_wanted()
    first.unacked = 5
    second = Consumer("b", None, Channel(), prefetch=2)  # type: ignore[arg-type]
    second.unacked = 2
    consumers.add(second)
    assert consumers.step_wanted()  # several: the step's round robin decides
    consumers.remove(second)
    for unlimited in (Consumer("c", None, Channel()), Consumer("d", None, Channel(), no_ack=True, prefetch=1)):  # type: ignore[arg-type]
        consumers.remove(next(iter(consumers)))
        unlimited.unacked = 9
        consumers.add(unlimited)
        assert consumers.step_wanted()  # no window (prefetch 0, or no-ack)


@pytest.mark.parametrize("seed", range(8))
def test_a_round_is_next_ready_once_per_message_whatever_the_priorities(seed: int) -> None:
    """``pick_round`` (a round found to be one consumer's by two ``next_ready`` calls) picks as the
    reference scan does: once the highest priority's windows are full, lower priorities take the rest of
    the round, also when one consumer alone was at the top (consumers opened together, the first of
    the highest priority filling its window while the others wait)."""
    rnd = random.Random(2000 + seed)
    fast, ref = ConsumerSet(), ReferenceRing()
    channel = Channel()
    live: list[tuple[Consumer, Consumer]] = []
    for i in range(rnd.choice([2, 3, 9])):
        kw: dict[str, Any] = {"prefetch": rnd.choice([1, 3, 50]), "priority": -i if seed % 2 else rnd.choice([0, -1])}
        a, b = Consumer(f"c{i}", None, channel, **kw), Consumer(f"c{i}", None, channel, **kw)  # type: ignore[arg-type]
        fast.add(a)
        ref.ring[b] = None
        live.append((a, b))
    picked = 0
    for _step in range(400):
        if rnd.random() < 0.6:
            limit = rnd.choice([1, 2, 7, 40, 500])
            picks, single = pick_round(fast, limit)
            expected = []
            for _ in range(limit):
                b = ref.next_ready()
                if b is None:
                    break
                b.unacked += 1
                expected.append(b)
            assert [c.tag for c in picks] == [c.tag for c in expected]
            assert single == (len({c.tag for c in picks}) == 1)
            picked += len(picks)
        else:
            a, b = rnd.choice(live)
            if a.unacked:
                n = rnd.randint(1, a.unacked)
                a.credit(n)
                b.credit(n)
        assert [a.unacked for a, _ in live] == [b.unacked for _, b in live]
    assert picked > 100


def test_lower_priorities_take_the_rest_of_a_round_the_first_consumer_cannot() -> None:
    """Two consumers opened together, priorities 0 and -1, windows of 3: a round of 10 gives the first
    3 and the second 3 (a round that stopped at the first's window left the second without messages
    until the next credit, which never came from a reader holding all it got)."""
    channel = Channel()
    first = Consumer("first", None, channel, prefetch=3, priority=0)  # type: ignore[arg-type]
    second = Consumer("second", None, channel, prefetch=3, priority=-1)  # type: ignore[arg-type]
    consumers = ConsumerSet()
    consumers.add(first)
    consumers.add(second)
    picks, single = pick_round(consumers, 10)
    assert [c.tag for c in picks] == ["first"] * 3 + ["second"] * 3
    assert not single
