"""PositionSet (the unacked positions' set: _cstore's open-addressed array, or a Python set) answers as a
set of ints would, and a queue's unacked positions at 1,000 consumers' sizes settle, requeue and recover
as before: acks interleaved across consumers, out of order, twice, and a crash with half of them written."""

from __future__ import annotations

import random
import sys
from array import array
from pathlib import Path

import pytest

from lavinpy.store.accel import cstore
from lavinpy.store.message_store import MessageStore
from lavinpy.store.queue_index import QueueIndex
from lavinpy.store.unacked_positions import PositionSet, UnackedPositions
from lavinpy.wire.position import make_pos


def test_the_compiled_set_is_the_one_selected_when_built() -> None:
    assert PositionSet is (cstore.PositionSet if cstore is not None else set)


def _positions(rng: random.Random, n: int) -> list[int]:
    """Store-like positions: a few segments (the low bits), offsets a record apart (the high bits),
    and the extremes."""
    out = [make_pos(rng.randint(1, 3), 120 * rng.randrange(1 << 20)) for _ in range(n)]
    return out + [0, 1, (1 << 64) - 1, (1 << 64) - 2, make_pos(0xFFFFFFFF, 0xFFFFFFFF)]


@pytest.mark.parametrize("seed", range(6))
def test_any_sequence_of_operations_answers_as_a_set_of_ints(seed: int) -> None:
    rng = random.Random(seed)
    pool = _positions(rng, 3000)
    got, model = PositionSet(), set()
    for _ in range(400):
        op = rng.randrange(7)
        some = rng.sample(pool, rng.randint(0, 300))
        if op == 0:
            got.update(some)
            model.update(some)
        elif op == 1:
            got.difference_update(some)
            model.difference_update(some)
        elif op == 2:
            assert got.issuperset(some) == model.issuperset(some)
            if model:
                held = rng.sample(sorted(model), min(len(model), 20))
                assert got.issuperset(held) and got.issuperset(held + held)
        elif op == 3:
            for pos in some[:20]:
                got.add(pos)
                model.add(pos)
        elif op == 4:
            for pos in some[:20]:
                if pos in model:
                    got.remove(pos)
                    model.remove(pos)
                else:
                    with pytest.raises(KeyError):
                        got.remove(pos)
        elif op == 5:
            for pos in some[:20]:
                got.discard(pos)
                model.discard(pos)
        elif rng.random() < 0.2:
            got.clear()
            model.clear()
        assert len(got) == len(model)
        assert all((pos in got) == (pos in model) for pos in some)
    assert sorted(got) == sorted(model)


def test_what_is_no_position_is_in_no_set_and_cannot_be_added() -> None:
    got = PositionSet()
    got.update([5, 7])
    assert "5" not in got and -5 not in got and (1 << 64) + 5 not in got and 5.5 not in got
    assert not got.issuperset([5, -1])
    if cstore is not None:
        with pytest.raises((TypeError, OverflowError)):
            got.add(-1)
        with pytest.raises((TypeError, OverflowError)):
            got.update(["x"])
    got.difference_update([-1, "x", 5])
    assert sorted(got) == [7]


def test_a_drained_set_gives_its_table_back() -> None:
    got = PositionSet()
    empty = sys.getsizeof(got)
    many = [make_pos(2, 120 * i) for i in range(100_000)]
    got.update(many)
    assert sys.getsizeof(got) > empty + 8 * 100_000
    got.difference_update(many[:99_990])
    assert sys.getsizeof(got) < empty + 8 * 1000
    assert sorted(got) == sorted(many[99_990:])


def _consumers_shares(taken: list[int], width: int) -> list[list[int]]:
    return [taken[j::width] for j in range(width)]


def test_a_thousand_consumers_interleaved_acks_out_of_order_acks_and_double_acks() -> None:
    """100,000 unacked positions taken in runs, each run round-robined over 1,000 consumers (held whole,
    split, or neither), acked per consumer in order but interleaved across consumers, some out of order,
    some requeued, some twice: the answers and what is left are a set's."""
    rng = random.Random(31)
    unacked, model = UnackedPositions(), set()
    owed: list[list[int]] = [[] for _ in range(1000)]
    at = 0
    for r in range(30):
        taken = [make_pos(1 + at // 40_000, 130 * (at % 40_000) + 8 * i) for i in range(3500)]
        at += 3500
        unacked.add_run(taken)
        model.update(taken)
        shares = _consumers_shares(taken, 1000)
        if r % 2:  # each consumer's share a run of its own (else the run is held whole)
            unacked.split_run(taken, shares)
        for j, share in enumerate(shares):
            owed[j].extend(share)
    assert len(unacked) == len(model) == 105_000
    for _ in range(200):  # interleaved consumers' ack reads, each a few in order
        j = rng.randrange(1000)
        k = rng.randint(1, 7)
        batch, owed[j] = owed[j][:k], owed[j][k:]
        if rng.random() < 0.1:
            rng.shuffle(batch)
        assert unacked.remove_many(batch) is None
        model.difference_update(batch)
    early = sorted(model)[:5000]
    for _ in range(100):  # single out-of-order acks and double acks
        pos = rng.choice(early) if rng.random() < 0.8 else make_pos(9, 8)
        assert unacked.remove(pos) == (pos in model)
        assert not unacked.remove(pos)
        model.discard(pos)
    held = sorted(model)[:3]
    assert unacked.remove_many([*held, make_pos(9, 8)]) == 3  # one not unacked: nothing changed
    assert unacked.remove_many(held) is None
    model.difference_update(held)
    assert len(unacked) == len(model)
    assert set(unacked.positions()) == model


def test_recovery_after_a_crash_with_a_thousand_consumers_acks_half_written(tmp_path: Path) -> None:
    """A durable queue: 20,000 messages taken in runs for 1,000 consumers, acked interleaved (some out of
    order, some requeued), the ack file written for half of them, then a crash (no clean close): the
    reopened queue is enq minus the acks written, in enq order; the files are the same entries as before."""
    store = MessageStore(tmp_path, segment_size=1 << 20)
    store.open()
    try:
        q = QueueIndex("q", store, tmp_path / "q")
        q.open()
        positions = [store.append("ex", "rk", b"\x00\x00", i.to_bytes(4, "little")) for i in range(20_000)]
        for pos in positions:
            q.push(pos)
        taken: list[int] = []
        while len(taken) < 20_000:
            run = q.shift_many(3500)
            if len(taken) // 3500 % 2:
                q.split_taken(run, _consumers_shares(run, 1000))
            taken += run
        assert taken == positions and q.unacked_count == 20_000
        rng = random.Random(7)
        shares = _consumers_shares(taken, 1000)
        order = [pos for j in rng.sample(range(1000), 1000) for pos in shares[j][:10]]
        written = order[: len(order) // 2]
        q.ack_many(written)
        with pytest.raises(KeyError):
            q.ack_many(written[-3:])  # a double ack: refused, nothing changed
        q.write_buffers()
        requeued = order[len(order) // 2: len(order) // 2 + 50]
        for pos in requeued:
            q.requeue(pos)
        for pos in reversed(order[len(order) // 2 + 50:]):  # acked, never written: lost in the crash
            q.ack(pos)
        assert q.unacked_count == 20_000 - len(order)
        assert list(array("Q", (tmp_path / "q" / "enq").read_bytes())) == positions
        assert list(array("Q", (tmp_path / "q" / "ack").read_bytes())) == written
        again = QueueIndex("q", store, tmp_path / "q")  # the crash: what q buffered never reached the files
        again.open()
        acked = set(written)
        assert list(again) == [pos for pos in positions if pos not in acked]
        assert again.unacked_count == 0
        q.close(clean=False)
    finally:
        store.close()
