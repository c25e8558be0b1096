"""A stream's filter-value index kept beside its entries (``filter_tags``, stream_tags.TagsFile): a restart
loads it instead of reading the records; a crash after the last append rebuilds only the tail; a damaged
file is kept up to its first bad frame; tags the entries do not hold any more are dropped; a retention
trim rewrites it. Filtering stays exact in every case."""

from __future__ import annotations

from pathlib import Path

from lavinpy.broker.queues.stream import StreamQueue
from lavinpy.broker.queues.stream_tags import TAGS_FILE, UNKNOWN
from tests.broker.test_stream_queue import offset_header, open_stream
from tests.broker.test_stream_tags import _consume, _publish, _values

VALUES = (["us"] * 300 + ["eu"] + [None] * 50 + ["asia,eu"]) * 4
FILTER = {"x-stream-filter": "eu", "x-stream-offset": "first"}
EXPECTED = ["eu", "asia,eu"] * 4


def _open(path: Path, arguments: dict | None = None):
    return open_stream(path, arguments)


def _counting_reads(queue: StreamQueue) -> list[int]:
    """Every record the stream's store reads from now on (a record read through both methods: twice)."""
    reads: list[int] = []
    messages = queue.vhost.store.messages
    plain_many, plain_one = messages.read_many, messages.read

    def read_many(positions):
        reads.extend(positions)
        return plain_many(positions)

    def read(pos):
        reads.append(pos)
        return plain_one(pos)

    messages.read_many = read_many  # type: ignore[method-assign]
    messages.read = read  # type: ignore[method-assign]
    return reads


def _rebuild_all(queue: StreamQueue) -> None:
    while queue.tags.rebuilding:
        queue.rebuild_tags(limit=1_000)


def test_a_clean_stop_keeps_the_index_and_a_restart_reads_no_record(tmp_path: Path) -> None:
    store, queue = _open(tmp_path)
    _publish(queue, VALUES)
    queue.apply_retention()  # the periodic task appends the new tags
    _publish(queue, ["eu", "us"])
    queue.stop_timers()  # a clean stop appends the rest
    tags = bytes(queue.tags.tags)
    store.close()
    store, queue = _open(tmp_path)
    try:
        reads = _counting_reads(queue)
        assert not queue.tags.rebuilding
        assert bytes(queue.tags.tags) == tags and UNKNOWN not in tags
        queue.apply_retention()
        assert reads == []  # nothing was read to know the tags
        channel = _consume(queue, FILTER)
        assert _values(channel) == [*EXPECTED, "eu"]
        assert len(set(reads)) == len(EXPECTED) + 1  # only the matches were read
    finally:
        store.close()


def test_after_a_crash_only_the_offsets_past_the_last_append_are_rebuilt(tmp_path: Path) -> None:
    store, queue = _open(tmp_path)
    _publish(queue, VALUES)
    queue.apply_retention()
    _publish(queue, ["eu"] + ["us"] * 99)  # not appended to the file: lost with the process
    store.close()  # (no stop_timers: as after a kill -9)
    store, queue = _open(tmp_path)
    try:
        assert queue.tags.rebuilding and queue.tags.unknown_from == queue.index.first_offset + len(VALUES)
        reads = _counting_reads(queue)
        _rebuild_all(queue)
        assert len(set(reads)) == 100
        assert _values(_consume(queue, FILTER)) == [*EXPECTED, "eu"]
        queue.apply_retention()  # the rebuilt tail is appended: the next restart reads nothing
        store.close()
        store, queue = _open(tmp_path)
        assert not queue.tags.rebuilding
    finally:
        store.close()


def test_a_damaged_file_is_kept_up_to_its_first_bad_frame(tmp_path: Path) -> None:
    store, queue = _open(tmp_path)
    _publish(queue, VALUES[:700])
    queue.apply_retention()
    _publish(queue, VALUES[700:])
    queue.stop_timers()
    store.close()
    file = queue.index.directory / TAGS_FILE
    data = bytearray(file.read_bytes())
    data[-10] ^= 0xFF  # inside the last frame (the second append's tags)
    file.write_bytes(bytes(data))
    store, queue = _open(tmp_path)
    try:
        assert queue.tags.rebuilding and queue.tags.unknown_from == queue.index.first_offset + 700
        assert file.stat().st_size < len(data)  # the bad frame was cut off
        assert _values(_consume(queue, FILTER)) == EXPECTED  # exact while rebuilding
        reads = _counting_reads(queue)
        _rebuild_all(queue)
        assert len(set(reads)) == len(VALUES) - 700
    finally:
        store.close()


def test_tags_past_the_entries_are_dropped(tmp_path: Path) -> None:
    """The entries lost a tail the file had (an OS crash): those offsets will hold other messages."""
    store, longer = _open(tmp_path / "longer")
    _publish(longer, ["eu"] * 10)
    longer.stop_timers()
    longer_file = longer.index.directory / TAGS_FILE
    store.close()
    store, queue = _open(tmp_path / "s")
    _publish(queue, ["eu"] * 6)
    directory = queue.index.directory
    store.close()
    (directory / TAGS_FILE).write_bytes(longer_file.read_bytes())  # tags of 10 offsets for 6 entries
    store, queue = _open(tmp_path / "s")
    _publish(queue, ["us"] * 4)  # offsets 6..9: other messages than the file's
    queue.stop_timers()
    store.close()
    store, queue = _open(tmp_path / "s")
    try:
        assert not queue.tags.rebuilding
        assert _values(_consume(queue, FILTER)) == ["eu"] * 6
        assert _values(_consume(queue, {**FILTER, "x-stream-filter": "us"})) == ["us"] * 4
    finally:
        store.close()


def test_a_retention_trim_rewrites_the_file_from_the_head(tmp_path: Path, monkeypatch) -> None:
    from lavinpy.broker.queues import stream_tags

    monkeypatch.setattr(stream_tags, "TRIM_MIN", 0)
    store, queue = _open(tmp_path, {"x-max-length-bytes": 8_000})
    values = ["eu" if i % 7 == 0 else "us" for i in range(400)]
    _publish(queue, values[:200])
    queue.apply_retention()
    _publish(queue, values[200:])
    queue.stop_timers()
    first = queue.index.first_offset
    assert queue.tags.base > 1 and queue.tags_file.base == queue.tags.base
    store.close()
    store, queue = _open(tmp_path, {"x-max-length-bytes": 8_000})
    try:
        assert queue.index.first_offset == first and not queue.tags.rebuilding
        got = [offset_header(m) for *_x, m, _r in _consume(queue, FILTER).deliveries]
        # offsets count from 1: message i of the 400 has offset i + 1
        assert got == [i + 1 for i in range(first - 1, 400) if i % 7 == 0]
    finally:
        store.close()
