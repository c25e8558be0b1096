"""A delivery round's positions split into each picked consumer's share (``round_picks.shares_of``): the
owners in first-pick order, each one's positions in pick order, for a few owners (a pass each), many
(a step per pick) and whole rounds of any number (slices)."""

from __future__ import annotations

import random

import pytest

from lavinpy.broker.queues.round_picks import shares_of


class Owner:
    """Compared by identity, as consumers are."""


def one_step_each(picks: list[Owner], positions: list[int]) -> list[list[int]]:
    shares: dict[Owner, list[int]] = {}
    for owner, pos in zip(picks, positions, strict=True):
        shares.setdefault(owner, []).append(pos)
    return list(shares.values())


@pytest.mark.parametrize("owner_count", [2, 3, 8, 9, 40])
def test_shares_keep_first_pick_order_and_pick_order(owner_count: int) -> None:
    rng = random.Random(owner_count)
    owners = [Owner() for _ in range(owner_count)]
    for length in (owner_count, 64, 67, 68, 257):
        if length in (64, 67, 68):  # whole rounds (and a part of one), taken as slices; 68: one pick off
            picks = [owners[i % owner_count] for i in range(length)]
            if length == 68:
                picks[-2], picks[-1] = picks[-1], picks[-2]
        else:
            picks = [rng.choice(owners) for _ in range(length)]
        positions = [rng.getrandbits(48) for _ in range(length)]
        distinct = dict.fromkeys(picks)
        got = shares_of(distinct, picks, positions)
        assert got == one_step_each(picks, positions)
        assert len(got) == len(distinct) and sum(map(len, got)) == length
