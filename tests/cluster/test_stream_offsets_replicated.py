"""A stream's tracked consumer offsets replicate: a follower attached to a real leader holds the same
consumer_offsets.json, and a broker opened on its copy (as a promoted follower would) resumes the tag
exactly where the leader had it: its first unacknowledged offset and the ones it acknowledged after it."""

from __future__ import annotations

import time
from pathlib import Path

import pika
import pytest

from lavinpy import config as config_module
from lavinpy.broker.broker import Broker
from lavinpy.broker.queues.stream import StreamQueue

from .replication_harness import Leader, replicated_hashes, start_follower, stop_process

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
        for i in range(6):
            channel.basic_publish("", "events", f"m{i}".encode())
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
        leader.flush_all()
        leader.wait_caught_up("follower")
    finally:
        output = stop_process(follower)
        leader.stop()
    assert "Traceback" not in output, output
    hashes = replicated_hashes(follower_dir)
    assert hashes == replicated_hashes(leader.data_dir)
    assert any(rel.endswith("/consumer_offsets.json") for rel in hashes)
    promoted = Broker(config_module.load(None, env={}, overrides={"data_dir": str(follower_dir)}))
    promoted.open()
    try:
        stream = promoted.vhosts["/"].queues["events"]
        assert isinstance(stream, StreamQueue)
        assert stream.offsets.resume_offset("reader") == 3  # m2, offset 3: the first unacknowledged
        assert stream.offsets.resume_skips("reader") == {4}  # m3, acknowledged after it
    finally:
        promoted.close()
