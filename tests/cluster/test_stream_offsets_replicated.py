"""A stream's tracked consumer offsets replicate: a follower attached to a real leader holds the same
consumer_offsets.json, and a broker opened on its copy (as a promoted follower would) resumes the tag
exactly where the leader had it: its first unacknowledged offset and the ones it acknowledged after it;
the filter-value index (filter_tags) is loaded from the copy, not rebuilt."""

from __future__ import annotations

import time
from pathlib import Path

import pika
import pytest

from lavinpy import config as config_module
from lavinpy.broker.broker import Broker
from lavinpy.broker.queues.stream import StreamQueue
from tests.helpers import wait_until

from .replication_harness import Leader, replicated_hashes, start_follower, stop_process


def _tags_written(data_dir: Path) -> int:
    """How many offsets' filter-value tags a stream's filter_tags file holds (0: no file yet)."""
    total = 0
    for path in data_dir.rglob("filter_tags"):
        data, at = path.read_bytes(), 0
        while at + 9 <= len(data):
            kind, size = data[at:at + 1], int.from_bytes(data[at + 1:at + 5], "little")
            total += size - 8 if kind == b"T" else 0
            at += 5 + size + 4
    return total

pytestmark = pytest.mark.timeout(60)


def test_tracked_offsets_reach_the_follower_and_resume_there(tmp_path: Path) -> None:
    leader = Leader(tmp_path / "leader").start()
    follower_dir = tmp_path / "follower"
    follower = start_follower(follower_dir, leader.replication.port)  # type: ignore[union-attr]
    try:
        leader.wait_caught_up("follower")
        connection = pika.BlockingConnection(pika.URLParameters(leader.url))
        channel = connection.channel()
        channel.queue_declare("events", durable=True, arguments={"x-queue-type": "stream"})
        channel.confirm_delivery()
        for i in range(6):  # m1 and m4 tagged: the filter-value index (filter_tags) replicates too
            tagged = pika.BasicProperties(headers={"x-stream-filter-value": "blue"}) if i in (1, 4) else None
            channel.basic_publish("", "events", f"m{i}".encode(), tagged)
        channel.basic_qos(prefetch_count=10)
        got: list[bytes] = []

        def on_message(ch, method, _props, body):  # m0, m1 and m3 acknowledged; m2, m4, m5 not
            got.append(body)
            if body in (b"m0", b"m1", b"m3"):
                ch.basic_ack(method.delivery_tag)

        channel.basic_consume("events", on_message, consumer_tag="reader", arguments={"x-stream-offset": "first"})
        deadline = time.monotonic() + 10
        while len(got) < 6 and time.monotonic() < deadline:
            connection.process_data_events(0.1)
        connection.process_data_events(0.2)
        connection.close()  # the consumer leaves: its offset is written and streamed
        time.sleep(0.3)
        wait_until(lambda: _tags_written(leader.data_dir) == 6, 10, what="the tags written by the periodic task")
        leader.flush_all()
        leader.wait_caught_up("follower")
    finally:
        output = stop_process(follower)
        leader.stop()
    assert "Traceback" not in output, output
    hashes = replicated_hashes(follower_dir)
    assert hashes == replicated_hashes(leader.data_dir)
    assert any(rel.endswith("/consumer_offsets.json") for rel in hashes)
    assert any(rel.endswith("/filter_tags") for rel in hashes)
    promoted = Broker(config_module.load(None, env={}, overrides={"data_dir": str(follower_dir)}))
    promoted.open()
    try:
        stream = promoted.vhosts["/"].queues["events"]
        assert isinstance(stream, StreamQueue)
        assert stream.offsets.resume_offset("reader") == 3  # m2, offset 3: the first unacknowledged
        assert stream.offsets.resume_skips("reader") == {4}  # m3, acknowledged after it
        assert not stream.tags.rebuilding  # the index was loaded from the copy, not read from the records
        first = stream.index.first_offset
        tags = [stream.tags.get(first + i) for i in range(6)]
        assert [tag != 0 for tag in tags] == [False, True, False, False, True, False], tags
    finally:
        promoted.close()
