"""The offset tracker of a stream (broker/queues/stream_offsets.py): the stored offset is the first unsettled
one, never past an unacknowledged delivery; generated tags are tracked only when asked; the file
comes back on a new tracker."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lavinpy.broker.queues.consumer import Consumer
from lavinpy.broker.queues.stream_offsets import OffsetTracker, OffsetTrackingError, tracking_requested


def test_who_is_tracked():
    assert tracking_requested("reader", None)
    assert not tracking_requested("amq.ctag-abc", {})
    assert tracking_requested("amq.ctag-abc", {"x-stream-automatic-offset-tracking": True})
    assert not tracking_requested("reader", {"x-stream-automatic-offset-tracking": False})
    with pytest.raises(OffsetTrackingError, match="x-stream-automatic-offset-tracking must be a boolean"):
        tracking_requested("reader", {"x-stream-automatic-offset-tracking": "yes"})


@given(count=st.integers(1, 30), settled=st.sets(st.integers(0, 29)))
def test_stored_offset_is_the_first_unsettled(tmp_path_factory, count, settled):
    directory = tmp_path_factory.mktemp("offsets")
    tracker = OffsetTracker(directory, "s")
    consumer = object()
    tracker.attach(consumer, "reader", 10)
    tracker.delivered_run(consumer, [1000 + i for i in range(count)], 10)
    for i in settled:
        if i < count:
            tracker.settled(1000 + i)
    unsettled = [10 + i for i in range(count) if i not in settled]
    assert tracker.resume_offset("reader") == (min(unsettled) if unsettled else 10 + count)
    tracker.detach(consumer)
    assert OffsetTracker(directory, "s").resume_offset("reader") == tracker.resume_offset("reader")


def test_the_least_recently_moved_tags_go_past_the_bound(tmp_path, monkeypatch):
    from lavinpy.broker.queues import stream_offsets

    monkeypatch.setattr(stream_offsets, "MAX_TAGS", 3)
    tracker = OffsetTracker(tmp_path, "s")
    for i in range(5):
        consumer = object()
        tracker.attach(consumer, f"tag{i}", 1)
        tracker.delivered(consumer, 100 + i, 1)
        tracker.settled(100 + i)
        tracker.detach(consumer)
    assert list(OffsetTracker(tmp_path, "s").stored) == ["tag2", "tag3", "tag4"]


@settings(max_examples=30, deadline=None)
@given(count=st.integers(1, 20), settled=st.sets(st.integers(0, 19)), order=st.permutations(range(20)),
       new=st.integers(0, 5), restart=st.booleans())
def test_a_resumed_tag_gets_exactly_what_it_had_not_settled_and_the_new(tmp_path_factory, count, settled, order, new,
                                                                         restart):
    from tests.broker.test_stream_queue import RecordingChannel, number, open_stream, publish, pump

    path = tmp_path_factory.mktemp("resume")
    store, queue = open_stream(path)
    publish(queue, count)
    channel = RecordingChannel()
    first = Consumer("reader", queue, channel, prefetch=100, arguments={"x-stream-offset": "first"})
    queue.add_consumer(first)  # type: ignore[arg-type]
    pump(queue)
    for i in order:  # settled in any order: the books are the channel's; the stream sees each settlement
        if i in settled and i < count:
            queue.ack(channel.deliveries[i][1])
    queue.remove_consumer(first)  # type: ignore[arg-type]
    publish(queue, new, start=count)
    if restart:
        store.close()
        store, queue = open_stream(path)
    again = RecordingChannel()
    queue.add_consumer(Consumer("reader", queue, again, prefetch=100))  # type: ignore[arg-type]
    pump(queue)
    assert [number(m) for _t, _p, m, _r in again.deliveries] == \
        [i for i in range(count) if i not in settled] + list(range(count, count + new))
    store.close()


@given(count=st.integers(1, 40), more=st.integers(0, 10),
       acks=st.lists(st.tuples(st.booleans(), st.integers(0, 49), st.integers(1, 12)), max_size=12))
def test_a_multiple_ack_settles_as_single_acks_do(tmp_path_factory, count, more, acks):
    """settled_many (the positions of a multiple ack: a consumer's oldest unsettled ones in order, taken
    at once, or any others) leaves the stored offset and the offsets settled out of order exactly as
    settling each position alone does, with deliveries coming between the acks."""
    bulk, single = (OffsetTracker(tmp_path_factory.mktemp("offsets"), "s") for _ in range(2))
    consumers = (object(), object())
    for tracker, consumer in zip((bulk, single), consumers, strict=True):
        tracker.attach(consumer, "reader", 10)
        tracker.delivered_run(consumer, [1000 + i for i in range(count)], 10)
    delivered = count
    unsettled = list(range(count))
    for step, (oldest, start, length) in enumerate(acks):
        if step == len(acks) // 2 and more:  # more deliveries after some acks
            for tracker, consumer in zip((bulk, single), consumers, strict=True):
                tracker.delivered_run(consumer, [1000 + delivered + i for i in range(more)], 10 + delivered)
            unsettled += range(delivered, delivered + more)
            delivered += more
        if not unsettled:
            break
        chosen = unsettled[:length] if oldest else unsettled[start % len(unsettled):][:length:2]
        positions = [1000 + i for i in chosen]
        bulk.settled_many(positions)
        for pos in positions:
            single.settled(pos)
        unsettled = [i for i in unsettled if i not in chosen]
        expected = 10 + unsettled[0] if unsettled else 10 + delivered
        assert bulk.resume_offset("reader") == single.resume_offset("reader") == expected
        assert bulk.resume_skips("reader") == single.resume_skips("reader")


def test_long_runs_of_multiple_acks_keep_the_offset_past_what_they_drop(tmp_path):
    """Deliveries acked in multiple acks of 1,000 (the settled front is dropped as it grows), one left
    unsettled in the middle: the stored offset stays at it, then moves to the end once it is acked."""
    tracker = OffsetTracker(tmp_path, "s")
    consumer = object()
    tracker.attach(consumer, "reader", 1)
    tracker.delivered_run(consumer, list(range(20_000)), 1)
    straggler = 12_345
    for first in range(0, 20_000, 1000):
        tracker.settled_many([pos for pos in range(first, first + 1000) if pos != straggler])
    assert tracker.resume_offset("reader") == 1 + straggler
    tracker.settled(straggler)
    assert tracker.resume_offset("reader") == 20_001
    tracker.delivered_run(consumer, list(range(20_000, 20_010)), 20_001)
    tracker.settled_many(list(range(20_000, 20_010)))
    assert tracker.resume_offset("reader") == 20_011
