"""A classic queue's delivery run framed straight from the store's segments by the consumer's channel.

Reading a run (``MessageStore.read_many``: a StoredMessage, its timestamp int and its body bytes a
record) and then framing it made three objects a delivery that only the frames used: at a Spark read's
share of 65,535 deliveries about 1,000 of a delivery's 2,350 instructions. An AMQP channel
(``deliver_stored_run``) frames the run's records from the segment's mapping in one compiled call
(``store.stamped_frames.segment_stored_frames``), each record checked as a read checks it; a record it
stops at (a segment's end, a large or damaged record, a missing segment) goes the general way alone
(``Queue.read``: a damaged or missing one reported and removed from the queue, as a run's read does),
then the run goes back to the compiled call. A round of several consumers (a Spark read's partitions
reading one queue at once) goes the same way, a run per consumer's share, while each is on a channel of
its own. Only for acking consumers of a queue on the plain paths (no TTL, limits or delivery limit:
their paths read each message) and with the C extension; the pure path reads and frames every run as
before, with the same bytes. ``readable`` is the general read's own, for a run with a damaged record.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from itertools import compress, repeat
from operator import is_
from typing import TYPE_CHECKING, Any

from ...store.stamped_frames import STORED_FRAMES_COMPILED, segment_stored_frames
from .consumer_set import whole_rounds
from .round_picks import shares_of

if TYPE_CHECKING:
    from ...store.record import StoredMessage
    from .queue_consumer import QueueConsumer

StoredRun = Callable[..., tuple[int, int, int]]  # Channel.deliver_stored_run


def stored_run_of(consumer: QueueConsumer) -> StoredRun | None:
    """The channel's ``deliver_stored_run`` when this consumer's runs are framed from the segments (an
    acking consumer, on a channel that has one, with the compiled framing); None: the general read."""
    if not STORED_FRAMES_COMPILED or consumer.no_ack:
        return None
    stored_run: StoredRun | None = getattr(consumer.channel, "deliver_stored_run", None)
    return stored_run


def deliver_stored(queue: Any, stored_run: StoredRun, consumer: QueueConsumer, positions: list[int],
                   redelivered: list[bool] | None) -> tuple[int, int, int]:
    """``positions`` (taken from ``queue``'s index, now unacked) delivered to ``consumer`` in order, with
    the flags of ``redelivered`` (None: none): framed from the segments as far as ``stored_run`` takes
    them, each record it stops at read alone (a damaged or missing one reported by ``queue.read`` and
    removed from the queue, not delivered). Returns (how many were delivered, the first one's body size,
    the last one's): the caller counts them in the consumer's window and sizes the next run by them."""
    frames_of = partial(segment_stored_frames, queue.vhost.store.messages)
    count = len(positions)
    i = delivered = 0
    first_size = last_size = 0
    while i < count:
        framed, first, last = stored_run(consumer, positions, i, redelivered, frames_of)
        if not framed:  # one record the general way, then back to the segment
            pos = positions[i]
            msg = queue.read(pos)
            if msg is None:
                queue.index.ack(pos)
                i += 1
                continue
            consumer.channel.deliver_run(consumer, [pos], [msg], None if redelivered is None else [redelivered[i]])
            framed, first = 1, len(msg.body)
            last = first
        if not delivered:
            first_size = first
        last_size = last
        delivered += framed
        i += framed
    return delivered, first_size, last_size



def deliver_stored_round(queue: Any, picks: list[QueueConsumer], single: bool, positions: list[int],
                         redelivered: list[bool] | None) -> bool:
    """A round's picks (``picks[i]`` takes ``positions[i]``, just taken from ``queue``'s index; ``single``:
    all one consumer's) delivered by ``deliver_stored``, each consumer's share as its runs (as the general
    round gives them: consumers sharing a channel one after the other), when each consumer is an acking
    one on a channel that frames from the segments, and they are few or go round in whole rounds
    (``shares_of`` is then a pass each or slices). A damaged record's turn is given back to its consumer.
    False: nothing done, the caller's read."""
    stored_run = stored_run_of(picks[0])
    if stored_run is None:
        return False
    if single:
        if (left := len(positions) - deliver_stored(queue, stored_run, picks[0], positions, redelivered)[0]) > 0:
            picks[0].credit(left)
        return True
    owners = dict.fromkeys(picks)
    width = len(owners)
    rounds = whole_rounds(picks, width)
    if width > 8 and not rounds:
        return False
    runs = [run for owner in owners if (run := stored_run_of(owner)) is not None]
    if len(runs) < width:
        return False
    shares = shares_of(owners, picks, positions)
    queue.index.split_taken(positions, shares)  # each share's in-order acks settle it
    for j, (owner, run, share) in enumerate(zip(owners, runs, shares, strict=True)):
        flags = (None if redelivered is None else redelivered[j::width] if rounds
                 else list(compress(redelivered, map(is_, picks, repeat(owner)))))
        if (left := len(share) - deliver_stored(queue, run, owner, share, flags)[0]) > 0:
            owner.credit(left)
    return True


def readable(queue: Any, positions: list[int], redelivered: list[bool] | None
             ) -> tuple[list[int], list[StoredMessage], list[bool] | None]:
    """A run with damaged records read one at a time (``take_run``'s general read): those are reported
    and removed (``queue.read``), the rest kept with their flags."""
    kept: list[int] = []
    messages: list[StoredMessage] = []
    flags: list[bool] = []
    for i, pos in enumerate(positions):
        msg = queue.read(pos)
        if msg is None:
            queue.index.ack(pos)
            continue
        kept.append(pos)
        messages.append(msg)
        flags.append(redelivered[i] if redelivered is not None else False)
    return kept, messages, flags if redelivered is not None else None
