"""A round of deliveries from one queue to many consumers, booked and framed in one call per round
(``consumer_set.deliver_picks`` finds it as the channel's ``deliver_round``).

At 1,000 consumers on one queue a published run reaches every consumer with room once per round, one
to a few messages each; one ``Channel.deliver_run`` per consumer cost five Python calls per consumer
(the run, its booking, the book's run, the frames, the output) and grouping the picks per channel a
loop step per message. Here each AMQP channel's share is booked and framed inline, with the tags,
books, counters and frames ``Channel.deliver_run`` gives the same run; a consumer on another kind of
channel, or a no-ack one, goes through its channel's ``deliver_run``.

With the compiled extensions a round whose consumers are all the common case (acking, on channels of
the first one's kind, with the usual books and output) is one C call (``_cwire_round.c``) that takes the
same steps per consumer without a Python call each; ``deliver_round_py`` is its pure twin (and takes
every other round).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..broker.ops.unacked_book import OWNED_RUN_MAX, UnackedBook, _Run
from ..wire import writer
from ..wire.accel import cwire

if TYPE_CHECKING:
    from ..broker.ops.deliveries import StoredMessage


_round: Any = None  # the compiled call, once ``init_round`` was given the connections' output


def init_round(send_many: Any, flush_bytes: int) -> None:
    """The compiled call appends a consumer's frames as ``send_many`` (``ConnectionOutput``'s, checked on
    each connection's type) does, flushing past ``flush_bytes`` (output.py calls this at import)."""
    global _round
    if cwire is not None:
        cwire.init_round(UnackedBook, _Run, send_many, flush_bytes, OWNED_RUN_MAX)
        _round = cwire.deliver_round


def deliver_round(consumers: list[Any], positions: list[int], messages: list[StoredMessage],
                  redelivered: list[bool] | None, picks: list[Any] | None = None) -> list[list[int]] | None:
    """``deliver_round_py`` in one compiled call when every consumer is the common case. With ``picks``
    (message ``i`` to ``picks[i]``, uneven): ``deliver_picked``, None when it did nothing."""
    if picks is not None:
        return deliver_picked(consumers, picks, positions, messages, redelivered)
    if _round is not None:
        channel = consumers[0].channel
        counted = _round(consumers, positions, messages, redelivered, type(channel), consumers[0].queue)
        if counted is not None:
            _count(consumers[0].queue, channel.deliveries.counters, counted[0], counted[1])
            return []
    return deliver_round_py(consumers, positions, messages, redelivered)


def deliver_picked(consumers: list[Any], picks: list[Any], positions: list[int], messages: list[StoredMessage],
                   redelivered: list[bool] | None) -> list[list[int]] | None:
    """Message ``i`` to ``picks[i]`` (``consumers`` the distinct picks in the order of their first) in one
    compiled call when every consumer is the common case and on a channel of its own: each consumer's
    share one run in pick order, as ``consumer_set._deliver_stretches`` gives it through
    ``Channel.deliver_run`` (its twin; the same tags, books, counters and frames). None when it is not
    the common case: nothing was done."""
    if _round is None:
        return None
    channel = consumers[0].channel
    counted = _round(consumers, positions, messages, redelivered, type(channel), consumers[0].queue, picks)
    if counted is None:
        return None
    _count(consumers[0].queue, channel.deliveries.counters, counted[0], counted[1])
    return []


def deliver_run_compiled(channel: Any, consumer: Any, positions: list[int], messages: list[StoredMessage],
                         redelivered: list[bool] | None) -> bool:
    """``Channel.deliver_run`` of an acking consumer's run as the compiled round of that one consumer (the
    same tags, books, counters and frames; no Python call for the booking, the frames and the output).
    A publisher's run handed to many consumers with uneven room comes as one such run per consumer
    (``consumer_set._deliver_stretches``). False when it is not the common case: nothing was done."""
    if _round is None or not positions:
        return False
    queue = consumer.queue
    counted = _round([consumer], positions, messages, redelivered, type(channel), queue)
    if counted is None:
        return False
    _count(queue, channel.deliveries.counters, counted[0], counted[1])
    return True


def deliver_round_py(consumers: list[Any], positions: list[int], messages: list[StoredMessage],
                     redelivered: list[bool] | None) -> list[list[int]]:
    """Message ``i`` (at ``positions[i]``) to ``consumers[i % len(consumers)]`` (distinct consumers of
    one queue, on distinct channels when one gets more than one message), each consumer's share as one
    run in the order of ``consumers``: as ``deliver_round_runs`` through ``Channel.deliver_run``.
    Returns the positions delivered to no-ack consumers, a list per run."""
    no_ack_runs: list[list[int]] = []
    queue = consumers[0].queue
    kind = type(consumers[0].channel)  # the channel class that names this function: its books and output
    width = len(consumers)
    single = width == len(positions)  # one message each: no slices
    deliver_one = writer.deliver
    deliver_run = writer.deliver_run
    counters = None
    counted = 0  # deliveries booked here, counted in ``counters`` and the queue's stats when it changes
    redeliveries = 0
    for j, consumer in enumerate(consumers):
        channel = consumer.channel
        if single:
            run_positions = [positions[j]]
            flags = None if redelivered is None else [redelivered[j]]
        else:
            run_positions = positions[j::width]
            flags = None if redelivered is None else redelivered[j::width]
        if type(channel) is not kind or consumer.no_ack:
            channel.deliver_run(consumer, run_positions, [messages[j]] if single else messages[j::width], flags)
            if consumer.no_ack:
                no_ack_runs.append(run_positions)
            continue
        deliveries = channel.deliveries
        if deliveries.counters is not counters:
            if counters is not None:
                _count(queue, counters, counted, redeliveries)
                counted = redeliveries = 0
            counters = deliveries.counters
        first = deliveries.tag + 1
        conn = channel.conn
        if single:
            deliveries.tag = first
            deliveries.unacked.add_run(first, queue, consumer, run_positions)
            counted += 1
            again = flags is not None and flags[0]
            redeliveries += again
            msg = messages[j]
            conn.send_many(deliver_one(channel.id, consumer.tag, first, again, msg.exchange, msg.routing_key,
                                       msg.properties, msg.body, conn.frame_max))
        else:
            count = len(run_positions)
            deliveries.tag += count
            deliveries.unacked.add_run(first, queue, consumer, run_positions)
            counted += count
            if flags is not None:
                redeliveries += sum(flags)
            conn.send_many(deliver_run(channel.id, consumer.tag, first, flags, messages[j::width], conn.frame_max))
    if counters is not None:
        _count(queue, counters, counted, redeliveries)
    return no_ack_runs


def _count(queue: Any, counters: Any, delivered: int, redelivered: int) -> None:
    """Deliveries (with acks) counted on the queue and in the protocol's counters, as ``Deliveries``
    counts each."""
    stats = queue.stats
    stats.deliver += delivered
    counters.deliver += delivered
    if redelivered:
        stats.redeliver += redelivered
        counters.redeliver += redelivered


def deliver_stamped_run(channel: Any, consumer: Any, positions: list[int], messages: list[StoredMessage],
                        first_offset: int, splices: dict[bytes, tuple[bytes, bytes]],
                        stamp: Callable[[list[StoredMessage], int], list[StoredMessage]]) -> None:
    """``Channel.deliver_run`` of a stream's run (none redelivered) whose ``x-stream-offset`` values
    (``first_offset`` on) are stamped while the frames are built (a method of ``Channel``): no stamped
    block and message a delivery. What ``splices`` cannot stamp yet is stamped by ``stamp`` and framed
    the general way, behind the rest and with the tags that follow theirs."""
    first = channel.deliveries.deliver_run(consumer, positions, None)
    conn = channel.conn
    frames, done = writer.deliver_stamped_run(channel.id, consumer.tag, first, messages, conn.frame_max,
                                              first_offset, splices)
    if done < len(messages):
        frames += writer.deliver_run(channel.id, consumer.tag, first + done, None,
                                     stamp(messages[done:], first_offset + done), conn.frame_max)
    conn.send_many(frames)


def deliver_segment_run(channel: Any, consumer: Any, positions: list[int], first_offset: int,
                        frames_of: Callable[..., tuple[bytes, int, int, int]],
                        splices: dict[bytes, tuple[bytes, bytes]]) -> tuple[int, int, int]:
    """A stream's run framed straight from its store segment (a method of ``Channel``): ``frames_of``
    (the store's ``segment_frames`` bound to its store) frames as many of ``positions`` from the first as
    it takes, with delivery tags from the channel's next and offsets from ``first_offset``; those are
    booked and sent. Returns (how many, first body size, last body size); 0 books and sends nothing."""
    deliveries = channel.deliveries
    conn = channel.conn
    frames, count, first_size, last_size = frames_of(positions, channel.id, consumer.tag, deliveries.tag + 1,
                                                     first_offset, conn.frame_max, splices)
    if count:
        first = deliveries.deliver_run(consumer, positions if count == len(positions) else positions[:count], None)
        assert first == deliveries.tag - count + 1  # the tags the frames carry
        conn.send_many([frames])
    return count, first_size, last_size


def deliver_stored_run(channel: Any, consumer: Any, positions: list[int], start: int, redelivered: list[bool] | None,
                       frames_of: Callable[..., tuple[bytes, int, int, int]]) -> tuple[int, int, int]:
    """A classic queue's run (an acking consumer's) framed straight from its store segment (a method of
    ``Channel``): ``frames_of`` (the store's ``segment_stored_frames`` bound to its store) frames as many of
    ``positions`` from ``start`` as it takes, with delivery tags from the channel's next and the flags of
    ``redelivered`` (None: none); those are booked and sent as ``deliver_run`` books and sends them.
    Returns (how many, first body size, last body size); 0 books and sends nothing."""
    deliveries = channel.deliveries
    conn = channel.conn
    frames, count, first_size, last_size = frames_of(positions, start, channel.id, consumer.tag, deliveries.tag + 1,
                                                     redelivered, conn.frame_max)
    if count:
        whole = start == 0 and count == len(positions)
        run = positions if whole else positions[start:start + count]
        flags = redelivered if whole or redelivered is None else redelivered[start:start + count]
        first = deliveries.deliver_run(consumer, run, flags)
        assert first == deliveries.tag - count + 1  # the tags the frames carry
        conn.send_many([frames])
    return count, first_size, last_size
