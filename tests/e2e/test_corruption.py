"""A byte flipped in a stored message record: only that message is lost, every other one is delivered.

Several durable queues share small segments; with the broker stopped one byte of a record is flipped
in a sealed segment and in the segment being written (in its length, CRC, header or body); after the
restart every other message of every queue is consumed with pika, counts are true, the damaged
message is reported in the log and, when it is still readable without its CRC, dead-lettered with
reason ``corrupt``.
"""

from __future__ import annotations

import hashlib
import shutil
from array import array
from pathlib import Path

import pika
import pytest

from .conftest import lavinpy_only

QUEUES = ("q0", "q1", "q2")
PER_QUEUE = 60
SEGMENT_SIZE = 16384
# Where the flipped byte is, from the record's start: its length (high byte), CRC, routing key, body.
FIELDS = {"length": 3, "crc": 5, "header": 18, "body": -3}


def body_of(queue: str, i: int) -> bytes:
    return f"{queue}-{i:03d}-".encode() + b"." * 150


def sha1(name: str) -> str:
    return hashlib.sha1(name.encode()).hexdigest()


def positions(vhost_dir: Path, queue: str) -> list[tuple[int, int]]:
    entries = array("Q", (vhost_dir / sha1(queue) / "enq").read_bytes())
    return [(p & 0xFFFFFFFF, p >> 32) for p in entries]


def flip(vhost_dir: Path, segment: int, offset: int, field: str) -> None:
    path = vhost_dir / f"msgs.{segment:010d}"
    data = bytearray(path.read_bytes())
    where = FIELDS[field]
    if where < 0:  # inside the body: from the record's end
        where += 8 + int.from_bytes(data[offset:offset + 4], "little")
    data[offset + where] ^= 0xFF
    path.write_bytes(bytes(data))


def consume_all(ch, queue: str) -> list[bytes]:
    """Every ready message, in order (basic.get until get-empty: no timing involved)."""
    got = []
    while True:
        method, _props, body = ch.basic_get(queue)
        if method is None:
            return got
        got.append(body)
        ch.basic_ack(method.delivery_tag)


@lavinpy_only()
@pytest.mark.parametrize("field", list(FIELDS))
def test_flipped_byte_loses_only_that_message(fresh_broker, tmp_path: Path, field: str) -> None:
    b = fresh_broker
    b.stop()
    shutil.rmtree(b.data_dir)  # its first segment was made at the default size
    config = tmp_path / "lavinpy.yaml"
    config.write_text(f"segment_size: {SEGMENT_SIZE}\n")
    b.extra_args = ["--config", str(config)]
    b.start()
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("dlq", durable=True)
    ch.queue_declare("q0", durable=True)
    ch.queue_declare("q1", durable=True, arguments={"x-dead-letter-exchange": "",
                                                     "x-dead-letter-routing-key": "dlq"})
    ch.queue_declare("q2", durable=True)
    persistent = pika.BasicProperties(delivery_mode=2)
    for i in range(PER_QUEUE):
        for queue in QUEUES:
            ch.basic_publish("", queue, body_of(queue, i), persistent)
    conn.close()
    b.stop()

    vhost_dir = b.data_dir / sha1("/")
    segments = sorted(int(p.name.split(".")[1]) for p in vhost_dir.glob("msgs.*"))
    assert len(segments) >= 3
    current = segments[-1]
    # q1 (with a DLX): a record in the middle of the first, sealed segment.
    q1 = positions(vhost_dir, "q1")
    in_first = [i for i, (seg, _) in enumerate(q1) if seg == segments[0]]
    sealed_victim = in_first[len(in_first) // 2]
    # q2: a record of the current segment that records of the other queues follow.
    q2 = positions(vhost_dir, "q2")
    in_current = [i for i, (seg, _) in enumerate(q2) if seg == current]
    assert len(in_current) >= 2
    current_victim = in_current[-2]
    flip(vhost_dir, *q1[sealed_victim], field)
    flip(vhost_dir, *q2[current_victim], field)

    b.start()
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    expected = {queue: [body_of(queue, i) for i in range(PER_QUEUE)] for queue in QUEUES}
    del expected["q1"][sealed_victim]
    del expected["q2"][current_victim]
    for queue in QUEUES:
        assert consume_all(ch, queue) == expected[queue], queue
        assert ch.queue_declare(queue, passive=True).method.message_count == 0
    # The queues take new messages, confirmed with an ack, and deliver them.
    ch.confirm_delivery()
    for queue in QUEUES:
        ch.basic_publish("", queue, b"after " + queue.encode(), persistent)
        assert consume_all(ch, queue) == [b"after " + queue.encode()]
    # Readable without its CRC (the length and the names still add up): dead-lettered as corrupt.
    dead = []
    for method, props, body in ch.consume("dlq", inactivity_timeout=1.5):
        if method is None:
            break
        dead.append((body, props.headers["x-death"][0]["reason"]))
        ch.basic_ack(method.delivery_tag)
    ch.cancel()
    if field in ("crc", "body"):
        assert len(dead) == 1 and dead[0][1] == "corrupt"
        assert dead[0][0][:8] == body_of("q1", sealed_victim)[:8]
    else:
        assert dead == []
    conn.close()
    log = b.log
    for queue, (segment, offset) in (("q1", q1[sealed_victim]), ("q2", q2[current_victim])):
        assert f"queue '{queue}': message at segment {segment} offset {offset} is damaged" in log


@lavinpy_only()
def test_damaged_queue_declaration_loses_no_queue_or_message(fresh_broker) -> None:
    """A byte flipped in the declare record of one queue: every other definition is kept, and the
    queue itself comes back from its directory with its messages and its bindings."""
    b = fresh_broker
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.exchange_declare("ex.before", "direct", durable=True)
    for queue in ("qa", "qvictim", "qc"):
        ch.queue_declare(queue, durable=True)
        ch.queue_bind(queue, "ex.before", routing_key=queue)
    ch.exchange_declare("ex.after", "fanout", durable=True)
    ch.queue_bind("qc", "ex.after")
    persistent = pika.BasicProperties(delivery_mode=2)
    for i in range(20):
        for queue in ("qa", "qvictim", "qc"):
            ch.basic_publish("ex.before", queue, f"{queue}-{i}".encode(), persistent)
    conn.close()
    b.stop()

    path = b.data_dir / sha1("/") / "definitions.amqp"
    data = bytearray(path.read_bytes())
    where = data.index(b"qvictim")  # first mention: its declare record (the binds come later)
    data[where + 1] ^= 0x20
    path.write_bytes(bytes(data))

    b.start()
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    for queue in ("qa", "qvictim", "qc"):
        assert ch.queue_declare(queue, passive=True).method.message_count == 20, queue
        assert consume_all(ch, queue) == [f"{queue}-{i}".encode() for i in range(20)]
    ch.confirm_delivery()
    ch.basic_publish("ex.before", "qvictim", b"routed", persistent)  # its binding came back too
    ch.basic_publish("ex.after", "", b"fanout", persistent)  # a definition after the damaged one
    assert consume_all(ch, "qvictim") == [b"routed"]
    assert consume_all(ch, "qc") == [b"fanout"]
    conn.close()
    assert "definition record at offset" in b.log
    assert "queue 'qvictim' is declared again from its directory" in b.log
