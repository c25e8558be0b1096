"""The filter-value index of a stream (broker/queues/stream_tags.py) and the filtering consumer over it: the
index never rules out a message that matches and decides exactly without header conditions
(hypothesis against the matcher); a filtering consumer gets exactly the matches whether they come
from the log, in hand one by one or as a published run, before and after a restart; and it reads
only the records the index cannot rule out."""

from __future__ import annotations

from array import array
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from lavinpy.broker.queues.consumer import Consumer
from lavinpy.broker.queues.publish_run import PublishRun
from lavinpy.broker.queues.stream import StreamQueue
from lavinpy.broker.queues.stream_filter import stream_filter
from lavinpy.broker.queues.stream_tags import UNKNOWN, FilterTags
from tests.broker.test_stream_queue import RecordingChannel, number, open_stream, props, pump

VALUES = st.sampled_from(["eu", "us", "asia", "prio"])
HEADER_NAMES = st.sampled_from(["level", "app"])
HEADER_VALUES = st.sampled_from(["error", "info", "1"])
MESSAGE_HEADERS = st.fixed_dictionaries({}, optional={
    "x-stream-filter-value": st.lists(VALUES, max_size=3).map(",".join),
    "level": HEADER_VALUES, "app": st.one_of(HEADER_VALUES, st.integers(0, 2)),
})
FILTERS = st.fixed_dictionaries({"x-stream-filter": st.one_of(
    st.lists(VALUES, min_size=1, max_size=3).map(",".join),
    st.lists(VALUES, min_size=1, max_size=3),
    st.dictionaries(HEADER_NAMES, HEADER_VALUES, min_size=1, max_size=2),
    st.tuples(VALUES, st.dictionaries(HEADER_NAMES, HEADER_VALUES, min_size=1, max_size=1)).map(list),
)}, optional={"x-filter-match-type": st.sampled_from(["all", "any"]), "x-stream-match-unfiltered": st.booleans()})


@given(arguments=FILTERS, messages=st.lists(MESSAGE_HEADERS, min_size=1, max_size=8))
def test_the_index_never_rules_out_a_match_and_is_exact_on_values(arguments, messages):
    wanted = stream_filter(arguments)
    assert wanted is not None
    tags = FilterTags(1)
    for headers in messages:
        tag = tags.tag_of(props(headers or None))
        assert tag != UNKNOWN
        decided = tags.decides(wanted, tag)
        matches = wanted.matches(headers or None)
        if decided is not None:
            assert decided == matches
        assert decided is not False or not matches
        if not wanted.headers:
            assert decided is not None  # values alone: the tag decides


def test_more_value_sets_than_tags_fall_back_to_reading():
    tags = FilterTags(1)
    seen = {tags.tag_of(props({"x-stream-filter-value": f"v{i}"})) for i in range(300)}
    assert UNKNOWN in seen and len(seen) == 255
    wanted = stream_filter({"x-stream-filter": "v299"})
    assert wanted is not None and tags.decides(wanted, UNKNOWN) is None


def _publish(queue: StreamQueue, values: list[str | None], *, as_run: bool = False) -> None:
    messages = queue.vhost.store.messages
    if as_run:  # one PublishRun shares its properties: one value for all
        p = props({"x-stream-filter-value": values[0]} if values[0] else None)
        bodies = [f"{values[0]}".encode()] * len(values)
        positions = array("Q", [messages.append("ex", "rk", p, body, 1000) for body in bodies])
        queue.push_many(positions, True, PublishRun("ex", "rk", p, bodies, 1000), 0)
        return
    for i, value in enumerate(values):
        p = props({"x-stream-filter-value": value} if value else None)
        body = i.to_bytes(4, "big") + f"{value}".encode()
        pos = messages.append("ex", "rk", p, body, 1000)
        queue.push(pos, True, messages.read(pos))


def _consume(queue: StreamQueue, arguments: dict) -> RecordingChannel:
    channel = RecordingChannel()
    queue.validate_consumer(False, 100_000, arguments)
    consumer = Consumer("c", queue, channel, prefetch=100_000, arguments=arguments)  # type: ignore[arg-type]
    queue.add_consumer(consumer)
    pump(queue)
    return channel


def _values(channel: RecordingChannel) -> list[str]:
    return [m.body[4:].decode() if len(m.body) > 4 and m.body[:4] != b"None" else m.body.decode()
            for _t, _p, m, _r in channel.deliveries]


def test_a_caught_up_filtering_consumer_gets_only_matches_in_hand_and_in_runs(tmp_path: Path):
    store, queue = open_stream(tmp_path)
    try:
        _publish(queue, ["eu", "us"])
        channel = _consume(queue, {"x-stream-filter": "eu", "x-stream-offset": "first"})
        _publish(queue, ["us", "eu", None, "eu,us"])
        _publish(queue, ["us"] * 20, as_run=True)
        _publish(queue, ["eu"] * 3, as_run=True)
        pump(queue)
        assert _values(channel) == ["eu", "eu", "eu,us", "eu", "eu", "eu"]
        assert [int.from_bytes(m.body[:4], "big") for _t, _p, m, _r in channel.deliveries[:3]] == [0, 1, 3]
    finally:
        store.close()


def test_after_a_restart_the_index_is_rebuilt_and_filtering_stays_exact(tmp_path: Path):
    values = (["us"] * 300 + ["eu"] + [None] * 50) * 4
    store, queue = open_stream(tmp_path)
    _publish(queue, values)
    store.close()
    store, queue = open_stream(tmp_path)
    try:
        assert queue.tags.rebuilding
        before = _consume(queue, {"x-stream-filter": "eu", "x-stream-offset": "first"})
        assert _values(before) == ["eu"] * 4
        queue.rebuild_tags(limit=1_000)  # bounded: the periodic task calls it until done
        assert queue.tags.rebuilding
        while queue.tags.rebuilding:
            queue.rebuild_tags(limit=1_000)
        reads: list[int] = []
        plain_read = queue.read

        def counting_read(pos: int):
            reads.append(pos)
            return plain_read(pos)

        queue.read = counting_read  # type: ignore[method-assign]
        after = _consume(queue, {"x-stream-filter": "eu", "x-stream-offset": "first"})
        assert _values(after) == ["eu"] * 4
        assert len(reads) == 4  # only the matches were read: the rest was passed over by the index
        unfiltered = _consume(queue, {"x-stream-filter": "eu", "x-stream-match-unfiltered": True,
                                      "x-stream-offset": "first"})
        assert len(unfiltered.deliveries) == 4 * 51
        assert [number(m) for *_x, m, _r in unfiltered.deliveries][:2] == [300, 301]
    finally:
        store.close()


@settings(max_examples=25, deadline=None)
@given(arguments=FILTERS, messages=st.lists(MESSAGE_HEADERS, min_size=1, max_size=12), split=st.integers(0, 12))
def test_live_and_logged_deliveries_are_exactly_the_matches(tmp_path_factory, arguments, messages, split):
    store, queue = open_stream(tmp_path_factory.mktemp("tags"))
    try:
        pos_of: dict[int, int] = {}
        stored = queue.vhost.store.messages

        def publish(batch: list[dict]) -> None:
            for headers in batch:
                n = len(pos_of)
                pos = stored.append("ex", "rk", props(headers or None), n.to_bytes(4, "big"), 1000)
                pos_of[n] = pos
                queue.push(pos, True, stored.read(pos))

        publish(messages[:split])
        channel = _consume(queue, {**arguments, "x-stream-offset": "first"})
        publish(messages[split:])
        pump(queue)
        wanted = stream_filter(arguments)
        assert wanted is not None
        expected = [i for i, headers in enumerate(messages) if wanted.matches(headers or None)]
        assert [int.from_bytes(m.body[:4], "big") for *_x, m, _r in channel.deliveries] == expected
    finally:
        store.close()


def test_retention_keeps_the_index_aligned_with_the_offsets(tmp_path: Path, monkeypatch):
    from lavinpy.broker.queues import stream_tags

    monkeypatch.setattr(stream_tags, "TRIM_MIN", 0)  # drop trimmed tags at every trim
    store, queue = open_stream(tmp_path, {"x-max-length-bytes": 8_000})
    try:
        values = ["eu" if i % 7 == 0 else "us" for i in range(400)]
        _publish(queue, values)
        first = queue.index.first_offset
        assert first > 1 and queue.tags.base > 1  # retention ran and the index followed it
        channel = _consume(queue, {"x-stream-filter": "eu", "x-stream-offset": "first"})
        got = [int.from_bytes(m.body[:4], "big") for *_x, m, _r in channel.deliveries]
        assert got == [i for i in range(first - 1, 400) if i % 7 == 0]
    finally:
        store.close()


def test_a_filtering_tag_resumes_at_exactly_its_unsettled_matches_and_the_new(tmp_path: Path):
    store, queue = open_stream(tmp_path)
    try:
        _publish(queue, ["eu", "us", "eu", "eu", "us", "eu"])  # eu at 0, 2, 3, 5
        channel = RecordingChannel()
        arguments = {"x-stream-filter": "eu", "x-stream-offset": "first"}
        first = Consumer("reader", queue, channel, prefetch=100, arguments=arguments)  # type: ignore[arg-type]
        queue.add_consumer(first)  # type: ignore[arg-type]
        pump(queue)
        delivered = [(int.from_bytes(m.body[:4], "big"), pos) for _t, pos, m, _r in channel.deliveries]
        assert [n for n, _ in delivered] == [0, 2, 3, 5]
        queue.ack(delivered[2][1])  # 3 acknowledged, out of order: 0, 2 and 5 are not
        queue.ack(delivered[0][1])  # then 0
        queue.remove_consumer(first)  # type: ignore[arg-type]
        _publish(queue, ["us", "eu"])  # offsets 7 and 8, numbered 0 and 1 in their call
        again = RecordingChannel()
        queue.add_consumer(Consumer("reader", queue, again, prefetch=100,  # type: ignore[arg-type]
                                    arguments={"x-stream-filter": "eu"}))
        pump(queue)
        assert [int.from_bytes(m.body[:4], "big") for *_x, m, _r in again.deliveries] == [2, 5, 1]  # 1: the new eu
    finally:
        store.close()
