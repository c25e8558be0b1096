"""What survives a clean restart (SIGTERM, start on the same data dir) and what does not.

Against RabbitMQ these run when LAVINPY_TEST_RABBITMQCTL is set: stop_app / start_app stand in for the
restart.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pika
import pytest

from . import bodies, channel_closed, get_all, persistent, uid, wait_until
from .conftest import REPO_ROOT, LocalBroker, http_call, lavinpy_only


def _connect(clients):
    conn, ch = clients.channel()
    ch.confirm_delivery()
    return conn, ch


def _restart(broker, clients):
    clients.close_connections()
    broker.restart()


def test_persistent_messages_on_durable_queue_survive_restart(fresh_broker, fresh_clients):
    conn, ch = _connect(fresh_clients)
    q = fresh_clients.track_queue(uid("dq"))
    ch.queue_declare(q, durable=True)
    for i in range(300):
        ch.basic_publish("", q, f"p{i}".encode(), persistent(message_id=str(i), headers={"n": i}))
    _restart(fresh_broker, fresh_clients)
    conn, ch = _connect(fresh_clients)
    ok = ch.queue_declare(q, durable=True).method
    assert ok.message_count == 300
    msgs = get_all(ch, q)
    assert bodies(msgs) == [f"p{i}".encode() for i in range(300)]
    assert [p.message_id for _, p, _ in msgs] == [str(i) for i in range(300)]
    assert [p.headers["n"] for _, p, _ in msgs] == list(range(300))
    assert all(p.delivery_mode == 2 for _, p, _ in msgs)


def test_transient_messages_do_not_survive_restart(fresh_broker, fresh_clients):
    conn, ch = _connect(fresh_clients)
    q = fresh_clients.track_queue(uid("dq"))
    ch.queue_declare(q, durable=True)
    for i in range(10):
        props = persistent() if i % 2 == 0 else pika.BasicProperties(delivery_mode=1)
        ch.basic_publish("", q, str(i).encode(), props)
    _restart(fresh_broker, fresh_clients)
    conn, ch = _connect(fresh_clients)
    assert bodies(get_all(ch, q)) == [b"0", b"2", b"4", b"6", b"8"]


def test_non_durable_queue_and_exchange_do_not_survive_restart(fresh_broker, fresh_clients):
    conn, ch = _connect(fresh_clients)
    tq, dq = fresh_clients.track_queue(uid("tq")), fresh_clients.track_queue(uid("dq"))
    tx, dx = fresh_clients.track_exchange(uid("tx")), fresh_clients.track_exchange(uid("dx"))
    ch.queue_declare(tq, durable=False)
    ch.queue_declare(dq, durable=True)
    ch.exchange_declare(tx, "direct", durable=False)
    ch.exchange_declare(dx, "direct", durable=True)
    ch.basic_publish("", tq, b"lost", persistent())
    _restart(fresh_broker, fresh_clients)
    conn, ch = _connect(fresh_clients)
    ch.queue_declare(dq, passive=True)
    ch.exchange_declare(dx, passive=True)
    with channel_closed(404):
        ch.queue_declare(tq, passive=True)
    ch = conn.channel()
    with channel_closed(404):
        ch.exchange_declare(tx, passive=True)


def test_durable_bindings_and_arguments_survive_restart(fresh_broker, fresh_clients):
    conn, ch = _connect(fresh_clients)
    q = fresh_clients.track_queue(uid("dq"))
    src, dst = fresh_clients.track_exchange(uid("src")), fresh_clients.track_exchange(uid("dst"))
    ch.queue_declare(q, durable=True, arguments={"x-max-length": 1000})
    ch.exchange_declare(src, "topic", durable=True)
    ch.exchange_declare(dst, "headers", durable=True)
    ch.exchange_bind(dst, src, "a.#")
    ch.queue_bind(q, dst, arguments={"x-match": "any", "h": "1"})
    ch.queue_bind(q, "amq.direct", q)
    ch.queue_bind(q, "amq.direct", "unbound-later")
    ch.queue_unbind(q, "amq.direct", "unbound-later")
    _restart(fresh_broker, fresh_clients)
    conn, ch = _connect(fresh_clients)
    ch.queue_declare(q, durable=True, arguments={"x-max-length": 1000})  # same arguments: fine
    ch.basic_publish(src, "a.b", b"1", persistent(headers={"h": "1"}))
    ch.basic_publish(src, "a.b", b"no-header", persistent(headers={"h": "2"}))
    ch.basic_publish(src, "b.b", b"wrong-key", persistent(headers={"h": "1"}))
    ch.basic_publish("amq.direct", q, b"2", persistent())
    ch.basic_publish("amq.direct", "unbound-later", b"unbound", persistent())
    assert bodies(get_all(ch, q)) == [b"1", b"2"]
    with channel_closed(406):
        ch.queue_declare(q, durable=True, arguments={"x-max-length": 5})


def test_acked_purged_and_deleted_stay_gone_after_restart(fresh_broker, fresh_clients):
    conn, ch = _connect(fresh_clients)
    q1, q2, q3 = (fresh_clients.track_queue(uid("dq")) for _ in range(3))
    for q in (q1, q2, q3):
        ch.queue_declare(q, durable=True)
        for i in range(5):
            ch.basic_publish("", q, str(i).encode(), persistent())
    msgs = get_all(ch, q1, auto_ack=False, limit=3)
    ch.basic_ack(msgs[0][0].delivery_tag)
    ch.basic_ack(msgs[2][0].delivery_tag)
    ch.basic_nack(msgs[1][0].delivery_tag, requeue=False)
    assert ch.queue_purge(q2).method.message_count == 5
    assert ch.queue_delete(q3).method.message_count == 5
    _restart(fresh_broker, fresh_clients)
    conn, ch = _connect(fresh_clients)
    assert bodies(get_all(ch, q1)) == [b"3", b"4"]
    assert get_all(ch, q2) == []
    with channel_closed(404):
        ch.queue_declare(q3, passive=True)


def test_unacked_messages_come_back_redelivered_after_restart(fresh_broker, fresh_clients):
    conn, ch = _connect(fresh_clients)
    q = fresh_clients.track_queue(uid("dq"))
    ch.queue_declare(q, durable=True)
    for i in range(6):
        ch.basic_publish("", q, str(i).encode(), persistent())
    c = conn.channel()
    c.basic_qos(prefetch_count=3)
    got = []
    c.basic_consume(q, lambda _c, m, p, b: got.append(m))
    assert wait_until(conn, lambda: len(got) == 3)
    c.basic_ack(got[0].delivery_tag)  # 0 acked; 1 and 2 unacked at the restart
    ch.queue_declare(q, passive=True)  # a round trip so the ack is processed before the restart
    _restart(fresh_broker, fresh_clients)
    peeked = http_call(fresh_broker, "GET", f"/api/queues/%2F/{q}/peek?count=5")[1] \
        if isinstance(fresh_broker, LocalBroker) else None  # peek is lavinpy's
    conn, ch = _connect(fresh_clients)
    msgs = get_all(ch, q)
    assert bodies(msgs) == [b"1", b"2", b"3", b"4", b"5"]
    assert msgs[0][0].redelivered and msgs[1][0].redelivered
    if peeked is not None:  # peek told the flag each delivery then carried
        assert [(m["payload"].encode(), m["redelivered"]) for m in peeked] == \
            [(body, method.redelivered) for method, _, body in msgs]


@lavinpy_only("peek is lavinpy's; kills the server")
def test_peek_after_a_crash_shows_the_recovered_messages_as_redelivered(fresh_broker, fresh_clients):
    conn, ch = _connect(fresh_clients)
    q = fresh_clients.track_queue(uid("dq"))
    ch.queue_declare(q, durable=True)
    for i in range(3):
        ch.basic_publish("", q, str(i).encode(), persistent())
    fresh_clients.close_connections()
    fresh_broker.kill9()  # their delivery state was not saved: each goes out as possibly seen before
    fresh_broker.start()
    path = f"/api/queues/%2F/{q}/peek?count=5"
    assert [(m["payload"], m["redelivered"]) for m in http_call(fresh_broker, "GET", path)[1]] == \
        [("0", True), ("1", True), ("2", True)]
    conn, ch = _connect(fresh_clients)
    method, _, body = ch.basic_get(q, auto_ack=True)
    assert body == b"0" and method.redelivered
    assert [m["redelivered"] for m in http_call(fresh_broker, "GET", path)[1]] == [True, True]


def test_large_persistent_message_survives_restart(fresh_broker, fresh_clients):
    conn, ch = _connect(fresh_clients)
    q = fresh_clients.track_queue(uid("dq"))
    ch.queue_declare(q, durable=True)
    big = bytes(range(251)) * (9 * 1024 * 1024 // 251)  # bigger than an 8 MiB segment
    ch.basic_publish("", q, b"small-before", persistent())
    ch.basic_publish("", q, big, persistent())
    ch.basic_publish("", q, b"small-after", persistent())
    _restart(fresh_broker, fresh_clients)
    conn, ch = _connect(fresh_clients)
    msgs = get_all(ch, q)
    assert [len(b) for b in bodies(msgs)] == [len(b"small-before"), len(big), len(b"small-after")]
    assert msgs[1][2] == big


def test_two_restarts_and_more_publishes(fresh_broker, fresh_clients):
    q = fresh_clients.track_queue(uid("dq"))
    for round_ in range(3):
        conn, ch = _connect(fresh_clients)
        ch.queue_declare(q, durable=True)
        for i in range(50):
            ch.basic_publish("", q, f"{round_}-{i}".encode(), persistent())
        if round_ == 1:
            got = get_all(ch, q, limit=20)  # consume 20 of the 100 present
            assert bodies(got)[0] == b"0-0"
        _restart(fresh_broker, fresh_clients)
    conn, ch = _connect(fresh_clients)
    expected = [f"{r}-{i}".encode() for r in range(3) for i in range(50)][20:]
    assert bodies(get_all(ch, q)) == expected


@lavinpy_only()
def test_second_broker_on_same_data_dir_refuses_to_start(fresh_broker):
    assert isinstance(fresh_broker, LocalBroker)
    r = subprocess.run(
        [sys.executable, "-m", "lavinpy", "--data-dir", str(fresh_broker.data_dir), "--amqp-port", "0",
         "--http-port", "0", "--prometheus-port", "0", "--mqtt-port", "0"],
        cwd=fresh_broker.workdir, capture_output=True, text=True, timeout=30,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("LAVINPY_")},
             "PYTHONPATH": str(REPO_ROOT)},
    )
    assert r.returncode != 0
    assert fresh_broker.running()


@lavinpy_only()
def test_sigterm_exits_zero_with_clients_connected(fresh_broker, fresh_clients):
    conn, ch = _connect(fresh_clients)
    q = ch.queue_declare(uid("q"), durable=True).method.queue
    ch.basic_publish("", q, b"x", persistent())
    ch.basic_consume(q, lambda *a: None)
    fresh_broker.stop()  # asserts exit code 0 within 15 s
    with pytest.raises(pika.exceptions.AMQPError):
        for _ in range(50):
            conn.process_data_events(time_limit=0.1)
    fresh_broker.start()
    conn, ch = _connect(fresh_clients)
    assert bodies(get_all(ch, q)) == [b"x"]
