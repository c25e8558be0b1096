"""Runs of publishes arriving in one read (one socket write here): routed and stored once per run,
with the same results as one by one: order, fanout copies, confirms, returns, in-hand deliveries,
the slow path for special messages in the middle of a run, segment roll-overs and kill -9."""

from __future__ import annotations

import shutil
from pathlib import Path

import pika

from . import get_all, uid
from .conftest import lavinpy_only
from .rawamqp import RawAMQP, commands, encode_properties, writer

PERSISTENT = commands.Basic.Properties(delivery_mode=2)


def run_bytes(channel: int, exchange: str, routing_key: str, bodies: list[bytes],
              properties: commands.Basic.Properties | None = None, mandatory: bool = False) -> bytes:
    method = writer.method_frame(channel, commands.Basic.Publish(exchange=exchange, routing_key=routing_key,
                                                                  mandatory=mandatory))
    raw = encode_properties(properties or commands.Basic.Properties())
    return b"".join(method + b"".join(writer.content_frames(channel, raw, body, 131072)) for body in bodies)


def confirmed_upto(c: RawAMQP, n: int) -> list:
    """Read until publish n is confirmed; every confirm must be an ack. Returns the other frames."""
    others = []
    while True:
        _ch, f = c.recv()
        if isinstance(f, commands.Basic.Ack):
            if f.delivery_tag >= n:
                assert f.delivery_tag == n
                return others
        elif isinstance(f, commands.Basic.Nack):
            raise AssertionError(f"unexpected nack {f.delivery_tag}")
        else:
            others.append(f)


def test_one_write_of_persistent_publishes_is_confirmed_and_kept_in_order(broker, clients):
    q = clients.track_queue(uid("run"))
    bodies = [f"m{i}".encode() * (i % 7 + 1) for i in range(600)]
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        c.call(1, commands.Queue.Declare(queue=q, durable=True), commands.Queue.DeclareOk)
        c.call(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
        c.send_raw(run_bytes(1, "", q, bodies, PERSISTENT))
        confirmed_upto(c, len(bodies))
        ok = c.call(1, commands.Queue.Declare(queue=q, passive=True), commands.Queue.DeclareOk)
        assert ok.message_count == len(bodies)
    ch = clients.connect().channel()
    got = get_all(ch, q)
    assert [b for _m, _p, b in got] == bodies
    assert all(p.delivery_mode == 2 for _m, p, _b in got)


def test_fanout_run_reaches_every_bound_queue(broker, clients):
    ex = clients.track_exchange(uid("fan"))
    queues = [clients.track_queue(uid("fq")) for _ in range(3)]
    ch = clients.connect().channel()
    ch.exchange_declare(ex, "fanout")
    for q in queues:
        ch.queue_declare(q)
        ch.queue_bind(q, ex)
    bodies = [str(i).encode() for i in range(400)]
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        c.call(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
        c.send_raw(run_bytes(1, ex, "any", bodies))
        confirmed_upto(c, len(bodies))
    for q in queues:
        assert [b for _m, _p, b in get_all(ch, q)] == bodies


def test_topic_run_follows_the_bindings_and_exchange_to_exchange_routes(broker, clients):
    topic = clients.track_exchange(uid("topic"))
    inner = clients.track_exchange(uid("inner"))
    stars, hashes, other, via = (clients.track_queue(uid(n)) for n in ("star", "hash", "other", "via"))
    ch = clients.connect().channel()
    ch.exchange_declare(topic, "topic")
    ch.exchange_declare(inner, "fanout")
    for q in (stars, hashes, other, via):
        ch.queue_declare(q)
    ch.queue_bind(stars, topic, "orders.*.eu")
    ch.queue_bind(hashes, topic, "orders.#")
    ch.queue_bind(other, topic, "invoices.#")
    ch.exchange_bind(inner, topic, "#.eu")
    ch.queue_bind(via, inner)
    bodies = [str(i).encode() for i in range(200)]
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        c.call(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
        c.send_raw(run_bytes(1, topic, "orders.new.eu", bodies) + run_bytes(1, topic, "orders.us", [b"us"]))
        confirmed_upto(c, len(bodies) + 1)
    assert [b for _m, _p, b in get_all(ch, stars)] == bodies
    assert [b for _m, _p, b in get_all(ch, hashes)] == [*bodies, b"us"]
    assert [b for _m, _p, b in get_all(ch, via)] == bodies
    assert get_all(ch, other) == []


def test_run_goes_in_hand_to_a_waiting_consumer_then_to_the_queue(broker, clients):
    q = clients.track_queue(uid("hand"))
    conn = clients.connect()
    ch = conn.channel()
    ch.queue_declare(q)
    ch.basic_qos(prefetch_count=50)
    got: list[tuple[int, bytes]] = []
    ch.basic_consume(q, lambda _c, m, _p, b: got.append((m.delivery_tag, b)))
    conn.process_data_events(0.2)
    bodies = [str(i).encode() for i in range(300)]
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        c.send_raw(run_bytes(1, "", q, bodies))
        c.call(1, commands.Queue.Declare(queue=q, passive=True), commands.Queue.DeclareOk)
        conn.process_data_events(1.0)
        assert len(got) == 50  # the prefetch window, taken in hand; the rest waits in the queue
        ok = c.call(1, commands.Queue.Declare(queue=q, passive=True), commands.Queue.DeclareOk)
        assert ok.message_count == 250
    while len(got) < len(bodies):
        ch.basic_ack(got[-1][0], multiple=True)
        before = len(got)
        conn.process_data_events(1.0)
        assert len(got) > before, f"stuck at {before} deliveries"
    assert [b for _t, b in got] == bodies


def test_special_messages_and_unroutable_runs_keep_their_semantics(broker, clients):
    q = clients.track_queue(uid("mix"))
    ch = clients.connect().channel()
    ch.queue_declare(q)
    expiring = commands.Basic.Properties(expiration="0")
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        c.call(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
        data = (run_bytes(1, "", q, [b"a1", b"a2", b"a3"]) + run_bytes(1, "", q, [b"expired"], expiring)
                + run_bytes(1, "", q, [b"b1", b"b2"]) + run_bytes(1, "", uid("nowhere"), [b"r1", b"r2", b"r3"],
                                                                   mandatory=True))
        c.send_raw(data)
        others = confirmed_upto(c, 9)
        returned = [f for f in others if isinstance(f, commands.Basic.Return)]
        assert len(returned) == 3 and all(r.reply_code == 312 for r in returned)
    # expiration 0: expired on arrival (no consumer), never delivered
    assert [b for _m, _p, b in get_all(ch, q)] == [b"a1", b"a2", b"a3", b"b1", b"b2"]


@lavinpy_only()
def test_runs_across_segment_rolls_survive_kill9(fresh_broker, tmp_path: Path):
    b = fresh_broker
    b.stop()
    shutil.rmtree(b.data_dir)  # its first segment was made at the default size
    config = tmp_path / "lavinpy.yaml"
    config.write_text("segment_size: 8192\n")
    b.extra_args = ["--config", str(config)]
    b.start()
    q = uid("roll")
    bodies = [f"{i:05d}".encode() * 100 for i in range(300)]  # 500 B each: about 16 per segment
    with RawAMQP(b.host, b.port) as c:
        c.handshake()
        c.open_channel(1)
        c.call(1, commands.Queue.Declare(queue=q, durable=True), commands.Queue.DeclareOk)
        c.call(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
        c.send_raw(run_bytes(1, "", q, bodies, PERSISTENT))
        confirmed_upto(c, len(bodies))
        b.kill9()
    b.start()
    assert len(list(b.data_dir.rglob("msgs.*"))) >= 300 * 500 // 8192  # the run spanned many segments
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    try:
        got = get_all(conn.channel(), q)
    finally:
        conn.close()
    assert [body for _m, _p, body in got] == bodies


def test_stream_run_offsets_in_hand_and_read_back(broker, clients):
    """A run into a stream: a caught-up consumer takes its credit in hand, a consumer from `first` and
    a later reader see every message once, in order, with consecutive x-stream-offset headers."""
    q = clients.track_queue(uid("srun"))
    conn = clients.connect()
    ch = conn.channel()
    ch.queue_declare(q, durable=True, arguments={"x-queue-type": "stream"})
    ch.basic_qos(prefetch_count=40)
    live: list[tuple[int, int, bytes]] = []
    ch.basic_consume(q, lambda _c, m, p, b: live.append((m.delivery_tag, p.headers["x-stream-offset"], b)),
                     arguments={"x-stream-offset": "next"})
    conn.process_data_events(0.2)
    bodies = [f"s{i}".encode() * (i % 5 + 1) for i in range(5000)]  # more than one index chunk
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        c.call(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
        c.send_raw(run_bytes(1, "", q, bodies, PERSISTENT))
        confirmed_upto(c, len(bodies))
        conn.process_data_events(0.5)
        assert len(live) == 40  # the prefetch window, taken in hand
        ok = c.call(1, commands.Queue.Declare(queue=q, passive=True, durable=True,
                                              arguments={"x-queue-type": "stream"}), commands.Queue.DeclareOk)
        assert ok.message_count == len(bodies)
    while len(live) < len(bodies):
        ch.basic_ack(live[-1][0], multiple=True)
        before = len(live)
        conn.process_data_events(1.0)
        assert len(live) > before, f"stuck at {before} deliveries"
    assert [(o, b) for _t, o, b in live] == list(zip(range(1, len(bodies) + 1), bodies, strict=True))
    ch2 = clients.connect().channel()
    ch2.basic_qos(prefetch_count=1000)
    again: list[tuple[int, bytes]] = []
    ch2.basic_consume(q, lambda c2, m, p, b: (again.append((p.headers["x-stream-offset"], b)),
                                              c2.basic_ack(m.delivery_tag)),
                      arguments={"x-stream-offset": "first"})
    deadline = 200
    while len(again) < len(bodies) and deadline:
        ch2.connection.process_data_events(0.1)
        deadline -= 1
    assert again == list(zip(range(1, len(bodies) + 1), bodies, strict=True))
