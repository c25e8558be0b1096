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
