"""A queue's requeued positions (store.requeued_positions) against the plain heap of enq-order keys they
replace: random pushes of one and of many (in order or not, onto none, a few onto many, many onto some),
pops of one and of many, and clears give the same positions in the same order."""

from __future__ import annotations

import heapq
import random

import pytest

from lavinpy.store.requeued_positions import RequeuedPositions, swap_halves
from lavinpy.wire.position import enq_order_key, pos_from_order_key


def position(rng: random.Random) -> int:
    return (rng.randrange(1, 1 << 23) << 32) | rng.randrange(1, 40)  # offset high, segment low


@pytest.mark.parametrize("seed", range(30))
def test_requeued_positions_come_out_as_a_heap_of_keys_would(seed: int) -> None:
    rng = random.Random(seed)
    requeued = RequeuedPositions()
    ref: list[int] = []
    for step in range(300):
        op = rng.random()
        if op < 0.2:
            pos = position(rng)
            requeued.push(pos)
            heapq.heappush(ref, enq_order_key(pos))
        elif op < 0.45:
            positions = [position(rng) for _ in range(rng.choice((2, 10, 70, 3000)))]
            if rng.random() < 0.5:  # a closing channel's: in enq order
                positions.sort(key=enq_order_key)
            requeued.push_many(positions)
            ref += map(enq_order_key, positions)
            heapq.heapify(ref)
        elif op < 0.6 and ref:
            assert requeued.pop() == pos_from_order_key(heapq.heappop(ref))
        elif op < 0.9:
            count = rng.choice((1, 3, 100, 2048, 10_000))
            expected = [pos_from_order_key(heapq.heappop(ref)) for _ in range(min(count, len(ref)))]
            assert requeued.pop_many(count) == expected
        else:
            requeued.clear()
            ref.clear()
        assert len(requeued) == len(ref)
        assert requeued.peek() == (pos_from_order_key(ref[0]) if ref else None)
        if step % 20 == 0:  # the whole contents now and then (sorting them all is the slow part)
            assert sorted(requeued.keys()) == sorted(ref)
            assert list(requeued.positions()) == [pos_from_order_key(key) for key in sorted(ref)]


@pytest.mark.parametrize("seed", range(5))
def test_windows_handed_back_one_after_another_come_out_in_enq_order(seed: int) -> None:
    """A dropped connection's channels each hand back their window (the parts of one queue, in any
    order, some overlapping in enq order), with a single requeue between them: runs of pops give every
    position once, in enq order."""
    rng = random.Random(seed)
    everything = sorted({position(rng) for _ in range(20_000)}, key=enq_order_key)
    windows = [everything[i:i + 2500] for i in range(0, len(everything), 2500)]
    rng.shuffle(windows)
    windows[0], windows[1] = sorted(windows[0] + windows[1][::2], key=enq_order_key), windows[1][1::2]
    requeued = RequeuedPositions()
    for i, window in enumerate(windows):
        requeued.push_many(window)
        if i == 3:
            requeued.push(window[0] + (1 << 32) * 5_000_000)  # one requeued on its own, between windows
    assert len(requeued) == len(everything) + 1
    taken: list[int] = []
    while len(requeued):
        taken += requeued.pop_many(rng.choice((1, 700, 2048)))
    assert taken == sorted(everything + [windows[3][0] + (1 << 32) * 5_000_000], key=enq_order_key)


@pytest.mark.parametrize("count", [0, 1, 63, 64, 65, 5000])
def test_swap_halves_is_enq_order_key_both_ways(count: int) -> None:
    rng = random.Random(count)
    positions = [position(rng) for _ in range(count)]
    keys = swap_halves(positions)
    assert keys == [enq_order_key(pos) for pos in positions]
    assert swap_halves(keys) == positions
