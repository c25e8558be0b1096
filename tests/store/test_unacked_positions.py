"""UnackedPositions: settling runs taken together, in and out of their order, as a set would."""

from __future__ import annotations

import random

from lavinpy.store.unacked_positions import UnackedPositions


def _runs(sizes: list[int], start: int = 100) -> list[list[int]]:
    runs, at = [], start
    for size in sizes:
        runs.append(list(range(at, at + size)))
        at += size
    return runs


def test_a_multiple_ack_spanning_many_runs_settles_them_all_and_keeps_the_rest() -> None:
    unacked = UnackedPositions()
    runs = _runs([5, 7, 3, 6])
    for run in runs:
        unacked.add_run(run)
    acked = runs[0] + runs[1] + runs[2] + runs[3][:2]
    assert unacked.remove_many(acked) is None
    assert len(unacked) == 4
    assert sorted(unacked.positions()) == runs[3][2:]
    assert unacked.remove_many(runs[3][2:]) is None
    assert len(unacked) == 0


def test_whole_runs_acked_by_their_own_lists_settle_as_equal_copies_would() -> None:
    unacked = UnackedPositions()
    runs = _runs([6, 6, 6])
    for run in runs:
        unacked.add_run(run)
    assert unacked.remove_many(runs[1]) is None  # the run's own list: no comparison needed
    assert unacked.remove_many(list(runs[0])) is None  # an equal copy: compared
    assert sorted(unacked.positions()) == runs[2]
    assert unacked.remove_many(runs[2][:2]) is None  # its head slice
    assert unacked.remove_many(runs[2]) == 0  # its own list again, but its head is settled: nothing changes
    assert sorted(unacked.positions()) == runs[2][2:]


def test_a_multiple_ack_with_a_position_not_unacked_changes_nothing() -> None:
    unacked = UnackedPositions()
    runs = _runs([4, 4])
    for run in runs:
        unacked.add_run(run)
    assert unacked.remove_many([*runs[0], *runs[1], 999]) == 8
    assert len(unacked) == 8
    assert sorted(unacked.positions()) == runs[0] + runs[1]


def test_settling_in_any_order_matches_a_set() -> None:
    rng = random.Random(34)
    for _ in range(200):
        unacked, model = UnackedPositions(), set()
        for run in _runs([rng.randint(1, 6) for _ in range(rng.randint(1, 6))]):
            unacked.add_run(run)
            model.update(run)
        extra = rng.sample(range(200, 220), 3)
        for pos in extra:
            unacked.add(pos)
            model.add(pos)
        for _ in range(6):
            ordered = sorted(model | {999})
            start = rng.randrange(len(ordered))
            take = ordered[start:start + rng.randint(1, 12)]
            if rng.random() < 0.3:
                rng.shuffle(take)
            bad = unacked.remove_many(take)
            missing = [i for i, pos in enumerate(take) if pos not in model]
            if missing:
                assert bad == missing[0]
            else:
                assert bad is None
                model.difference_update(take)
            assert len(unacked) == len(model)
            assert set(unacked.positions()) == model


def test_a_run_split_among_consumers_is_settled_part_by_part_in_any_order_of_parts() -> None:
    unacked = UnackedPositions()
    taken = list(range(10, 22))
    unacked.add_run(taken)
    parts = [taken[0::3], taken[1::3], taken[2::3]]  # a round robin over three consumers
    unacked.split_run(taken, parts)
    assert len(unacked) == 12
    assert unacked.remove_many(parts[1][:2]) is None
    assert unacked.remove_many(parts[0]) is None
    assert unacked.remove_many([*parts[1][2:], 99]) == 2  # nothing changed
    assert unacked.remove_many(parts[1][2:]) is None
    assert len(unacked) == 4
    assert sorted(unacked.positions()) == parts[2]


def test_a_run_already_partly_settled_is_not_split() -> None:
    unacked = UnackedPositions()
    taken = list(range(10, 16))
    unacked.add_run(taken)
    assert unacked.remove_many([10]) is None
    unacked.split_run(taken, [taken[1::2], taken[0::2]])  # would hold 10 again: ignored
    assert sorted(unacked.positions()) == taken[1:]


def test_one_position_parts_and_runs_settle_together_in_delivery_order() -> None:
    """A round of one message per consumer: each consumer's part is one position (held in the set);
    an ack batch of one consumer spans such positions and the head of a longer part."""
    unacked = UnackedPositions()
    first = list(range(10, 14))
    unacked.add_run(first)
    unacked.split_run(first, [[10], [11], [12, 13]])
    second = list(range(20, 23))
    unacked.add_run(second)
    unacked.split_run(second, [[20], [21, 22]])
    assert len(unacked) == 7
    assert unacked.remove_many([10, 20]) is None  # two singles
    assert unacked.remove_many([11, 21, 99]) == 2  # nothing changed
    assert unacked.remove_many([11, 21]) is None  # a single and a run's head slice
    assert len(unacked) == 3
    assert unacked.remove_many([12, 13, 22]) is None
    assert len(unacked) == 0 and not list(unacked.positions())


def test_real_positions_of_any_segment_and_offset_come_back_as_they_went_in() -> None:
    """Positions as the store makes them (segment id in the low 32 bits, byte offset above), held loose
    and in runs, settled in and out of order: membership, listing and the unknown one as a set of them."""
    def pos(segment: int, offset: int) -> int:
        return segment | (offset << 32)

    run = [pos(7, 40 * i) for i in range(30)]
    loose = [pos(0xFFFFFFFF, 0xFFFFFFF0), pos(1, 0), pos(0, 1 << 31)]
    unacked = UnackedPositions()
    unacked.add_run(run)
    for p in loose:
        unacked.add(p)
    assert run[5] in unacked and loose[0] in unacked and pos(7, 41) not in unacked
    assert sorted(unacked.positions()) == sorted(run + loose)
    assert sorted(unacked) == sorted(run + loose)
    assert unacked.remove_many([run[3], loose[2], pos(8, 0)]) == 2  # nothing changed
    assert unacked.remove_many(run[::2]) is None and unacked.remove(loose[0])
    assert not unacked.remove(loose[0])
    assert sorted(unacked.positions()) == sorted(run[1::2] + loose[1:])


def test_to_array_holds_every_position_and_leaves_the_runs_alone() -> None:
    unacked = UnackedPositions()
    runs = _runs([5, 7, 3])
    for run in runs:
        unacked.add_run(run)
    unacked.add(7)
    assert unacked.remove_many(runs[1][:2]) is None  # a run partly settled in order
    assert sorted(unacked.to_array()) == sorted([7, *runs[0], *runs[1][2:], *runs[2]])
    assert unacked.remove_many(runs[0]) is None  # still a run: its head slice settles it
    assert sorted(unacked.to_array()) == sorted([7, *runs[1][2:], *runs[2]])
