"""A delivery round's picks from the ready messages of a classic queue, with a path for the round that
serves one consumer.

With many consumers on one queue and a backlog, most rounds start at the end of one consumer's ack read:
every other consumer's window was filled at its own ack read, so that consumer alone has room and takes
the whole round. ``ConsumerSet.pick`` builds such a round as any other (the turn-order walk, the sweeps);
here two ``next_ready`` calls find out that it is one consumer's (the second gives the first again only
when no other consumer has room, and during a round no channel changes, so every further pick is the
same consumer's until its window is full). While priorities differ, lower ones take what the higher
ones have no room for, so the round is ``pick``'s. The picks, the windows counted and the ring's order
are what one delivery at a time (and ``pick``) gives.
"""

from __future__ import annotations

from itertools import compress, repeat
from operator import is_
from typing import TYPE_CHECKING

from .consumer_set import ConsumerSet, deliver_round_runs, whole_rounds

if TYPE_CHECKING:
    from ...store.record import StoredMessage
    from .queue_consumer import QueueConsumer


def pick_round(consumers: ConsumerSet, limit: int) -> tuple[list[QueueConsumer], bool]:
    """Up to ``limit`` consumers in round-robin order, one per message, each counted in its window at once
    (as ``consumers.pick(limit)``), and True when they are all one consumer (then no other one had room)."""
    if limit <= 0:
        return [], False
    if consumers.priorities_differ:  # one pass over the ring picks by priority; then whether all are one
        picks, _no_ack = consumers.pick(limit)
        return picks, bool(picks) and picks[-1] is picks[0] and picks.count(picks[0]) == len(picks)
    next_ready = consumers.next_ready
    first = next_ready()
    if first is None:
        return [], False
    counted = not first.no_ack
    if counted:
        first.unacked += 1
    if limit == 1:
        return [first], True
    second = next_ready()
    if second is None:  # its window is now full and no other consumer has room
        return [first], True
    if second is not first:  # others have room: the rest as ``pick`` goes on from these two
        if not second.no_ack:
            second.unacked += 1
        rest, _no_ack = consumers.pick(limit - 2)
        return [first, second, *rest], False
    count = limit
    if counted:
        first.unacked += 1
        if first.prefetch:
            count = min(limit, 2 + first.prefetch - first.unacked)
        first.unacked += count - 2
    return [first] * count, True


def deliver_share(consumer: QueueConsumer, positions: list[int], messages: list[StoredMessage],
                  redelivered: list[bool] | None) -> list[list[int]]:
    """A round's messages, all to ``consumer``, as one run (the channel's one-call round when it has one).
    Returns the positions delivered if it is a no-ack consumer, as ``deliver_picks`` does."""
    if not positions:
        return []
    deliver_round = getattr(consumer.channel, "deliver_round", None)
    if deliver_round is not None:
        no_ack_runs: list[list[int]] = deliver_round([consumer], positions, messages, redelivered)
        return no_ack_runs
    return deliver_round_runs([consumer], positions, messages, redelivered)


def shares_of(owners: dict[QueueConsumer, None], picks: list[QueueConsumer], positions: list[int]) -> list[list[int]]:
    """Each of ``owners``' (the distinct picks, in first-pick order) positions, in pick order. While they
    are few (a queue read by a few consumers, as a Spark job's partitions) one pass each at C speed
    instead of a Python step per pick; whole rounds of the same consumers (``_sweeps``' common case) as
    slices, however many they are."""
    width = len(owners)
    if len(picks) > width and whole_rounds(picks, width):
        return [positions[j::width] for j in range(width)]
    if width <= 8:
        return [list(compress(positions, map(is_, picks, repeat(owner)))) for owner in owners]
    shares: dict[QueueConsumer, list[int]] = {owner: [] for owner in owners}
    for consumer, pos in zip(picks, positions, strict=True):
        shares[consumer].append(pos)
    return list(shares.values())
