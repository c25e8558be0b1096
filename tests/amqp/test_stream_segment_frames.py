"""A stream consumer's bytes are those of each stored message stamped with its offset and framed the
general way (``writer.deliver``), in order and with consecutive tags, whichever way the runs were framed:
straight from the segment (compiled, lavinpy/store/_cstore_frames.c), by the codec's stamped framing, or
one at a time past a damaged record; compiled and pure give the same bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pamqp import body, commands
from session_client import Harness

from lavinpy.broker.queues import stream as stream_queue
from lavinpy.broker.queues.stream_stamps import with_stream_offset
from lavinpy.store import stamped_frames as sf
from lavinpy.wire import writer
from lavinpy.wire.position import OFFSET_SHIFT, SEGMENT_MASK

PROPERTIES = [None, commands.Basic.Properties(delivery_mode=2),
              commands.Basic.Properties(headers={"x-stream-offset": "theirs", "a": 1}, content_type="text/plain")]


def body_of(i: int) -> bytes:
    if i % 17 == 16:
        return b""
    if i == 40:
        return b"L" * (300 * 1024)  # a large record (read in place) split over several body frames
    if i == 41:
        return b"F" * 140_000  # larger than a frame
    return b"m%d" % i * (1 + i % 5)


@pytest.mark.parametrize("damaged", [None, 23])
def test_a_stream_read_s_bytes_are_the_general_framing_s(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          damaged: int | None) -> None:
    framed: list[int] = []
    own = stream_queue.segment_frames

    def counted(*args: Any) -> tuple[bytes, int, int, int]:
        got = own(*args)
        framed.append(got[1])
        return got

    monkeypatch.setattr(stream_queue, "segment_frames", counted)
    harness = Harness(tmp_path, fsync="never")
    try:
        publisher, consumer = harness.open_client(), harness.open_client()
        publisher.send((1, commands.Queue.Declare(queue="s", durable=True, arguments={"x-queue-type": "stream"})),
                       (1, commands.Exchange.Declare(exchange="ex.fan", exchange_type="fanout")),
                       (1, commands.Queue.Bind(queue="s", exchange="ex.fan")))
        publisher.read()
        count = 120
        for i in range(count):
            exchange, key = ("ex.fan", f"k{i % 3}") if i % 4 == 3 else ("", "s")
            method, head, whole = publisher.publish(1, key, body_of(i), exchange, PROPERTIES[(i // 5) % 3])
            size = publisher.conn.frame_max - 8  # a body larger than a frame goes in several
            publisher.send(method, head, *((1, body.ContentBody(whole[1].value[at:at + size]))
                                           for at in range(0, len(whole[1].value), size)))
        publisher.read()
        queue = harness.broker.vhosts["/"].queues["s"]
        stored = {offset: queue.read(queue.index.get(offset)) for offset in range(1, count + 1)}
        if damaged is not None:  # a body byte of one record changed on disk: it fails its CRC
            pos = queue.index.get(damaged)
            store = harness.broker.vhosts["/"].store.messages
            segment = store.readable(pos & SEGMENT_MASK)[0]
            offset = pos >> OFFSET_SHIFT
            end = offset + 8 + int.from_bytes(segment.mm[offset:offset + 4], "little")
            segment.mm[end - 1] ^= 0xFF
        consumer.send((1, commands.Basic.Qos(prefetch_count=1000)),
                      (1, commands.Basic.Consume(queue="s", consumer_tag="c", arguments={"x-stream-offset": "first"})))
        harness.run_soon()
        data = b"".join(consumer.conn.data_to_send())
        frame_max = consumer.conn.frame_max
        expected, tag = [], 1
        for offset, msg in stored.items():
            if offset == damaged:
                continue
            expected += writer.deliver_py(1, "c", tag, False, msg.exchange, msg.routing_key,
                                          with_stream_offset(msg.properties, offset), msg.body, frame_max)
            tag += 1
        qos_ok = writer.method_frame(1, commands.Basic.QosOk())
        consume_ok = writer.method_frame(1, commands.Basic.ConsumeOk(consumer_tag="c"))
        assert data == qos_ok + consume_ok + b"".join(expected)
        assert sum(framed) > 60 if sf.FRAMES_COMPILED else not framed
    finally:
        harness.close()
