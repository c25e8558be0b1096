"""Shovels between two lavinpy brokers (processes), the engine in the test process."""

from __future__ import annotations

import base64
import json
import logging
import os
import signal
import time
import urllib.request

import pika
import pytest

from lavinpy.shovel import worker
from lavinpy.shovel.definition import ShovelDefinitionError, parse_definition

pytestmark = pytest.mark.timeout(60)


def _publish(url: str, queue: str, count: int, **props) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.queue_declare(queue, durable=True)
    ch.confirm_delivery()
    for i in range(count):
        ch.basic_publish("", queue, str(i).encode(), pika.BasicProperties(delivery_mode=2, **props))
    conn.close()


def _drain(url: str, queue: str, expect: int, timeout: float = 15.0) -> list:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < expect and time.monotonic() < deadline:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            time.sleep(0.05)
            continue
        got.append((props, body))
    conn.close()
    return got


def _count(url: str, queue: str) -> int:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    n = conn.channel().queue_declare(queue, passive=True).method.message_count
    conn.close()
    return n


def test_queue_to_queue_with_forward_headers(two_brokers, engine) -> None:
    a, b = two_brokers
    _publish(a.url, "src", 500)
    engine.apply("s1", {"src-uri": a.url, "src-queue": "src", "dest-uri": [b.url], "dest-queue": "dst",
                        "dest-add-forward-headers": True, "dest-add-timestamp-header": True,
                        "dest-publish-properties": {"app_id": "moved"}})
    engine.wait_state("s1", "running")
    got = _drain(b.url, "dst", 500)
    assert [int(body) for _, body in got] == list(range(500))
    props = got[0][0]
    assert props.app_id == "moved" and props.delivery_mode == 2
    hop = props.headers["x-shovelled"][0]
    assert hop["shovel-name"] == "s1" and hop["src-queue"] == "src" and hop["shovel-type"] == "dynamic"
    assert "guest:***@" in hop["src-uri"]
    assert isinstance(props.headers["x-shovelled-timestamp"], int)
    row = engine.status("s1")
    assert row["forwarded"] == 500 and row["type"] == "dynamic" and row["dest_queue"] == "dst"
    assert row["src_uri"].startswith("amqp://guest:***@")
    assert _count(a.url, "src") == 0
    engine.remove("s1")


def test_delete_after_queue_length_then_gone(two_brokers, engine, caplog, monkeypatch) -> None:
    monkeypatch.setattr(worker, "PROGRESS_MIN_MESSAGES", 100)  # the log tells how far a big move got
    caplog.set_level(logging.INFO, logger="lavinpy.shovel")
    a, b = two_brokers
    _publish(a.url, "move-me", 300)
    engine.apply("once", {"src-uri": a.url, "src-queue": "move-me", "dest-uri": b.url, "dest-queue": "moved",
                          "src-delete-after": "queue-length", "src-prefetch-count": 50})
    deadline = time.monotonic() + 15
    while ("/", "once") not in engine.finished and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ("/", "once") in engine.finished
    assert engine.call(lambda: engine.shovels.status("/")) == []
    assert _count(b.url, "moved") == 300 and _count(a.url, "move-me") == 0
    steps = [r.getMessage() for r in caplog.records if "moving messages:" in r.getMessage()]
    assert steps[-1] == "shovel once in vhost / moving messages: 100% (300 of 300 messages)", steps
    assert len(steps) >= 3 and len(steps) <= 10, steps  # at most one line per 10 %


@pytest.mark.parametrize("ack_mode", ["on-publish", "no-ack"])
def test_delete_after_number_to_an_exchange(two_brokers, engine, ack_mode: str) -> None:
    a, b = two_brokers
    _publish(a.url, "n", 20)
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.queue_declare("k-bound", durable=True)
    ch.queue_bind("k-bound", "amq.direct", "k")
    conn.close()
    engine.apply("ten", {"src-uri": a.url, "src-queue": "n", "dest-uri": b.url, "dest-exchange": "amq.direct",
                         "dest-exchange-key": "k", "src-delete-after": 10, "ack-mode": ack_mode})
    deadline = time.monotonic() + 15
    while ("/", "ten") not in engine.finished and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ("/", "ten") in engine.finished
    time.sleep(0.3)  # the requeued prefetched ones are back in the source queue
    assert _count(a.url, "n") == 10
    assert _count(b.url, "k-bound") == 10


def test_exchange_source_no_ack(two_brokers, engine) -> None:
    a, b = two_brokers
    engine.apply("ex", {"src-uri": a.url, "src-exchange": "amq.topic", "src-exchange-key": "a.#",
                        "dest-uri": b.url, "dest-queue": "from-topic", "ack-mode": "no-ack"})
    engine.wait_state("ex", "running")
    conn = pika.BlockingConnection(pika.URLParameters(a.url))
    ch = conn.channel()
    for key in ("a.1", "b.1", "a.2"):
        ch.basic_publish("amq.topic", key, key.encode())
    conn.close()
    got = _drain(b.url, "from-topic", 2)
    assert [body for _, body in got] == [b"a.1", b"a.2"]
    engine.remove("ex")


def test_names_beyond_ascii_and_pamqps_length_are_shovelled(two_brokers, engine) -> None:
    """RabbitMQ takes any UTF-8 name up to 255 bytes; the shovel's client sends them as given (pamqp's
    constructors would refuse these: non-ASCII, and an exchange name over 127 characters), and a long
    shovel name still makes a consumer tag that fits."""
    a, b = two_brokers
    src, dst, exchange = "очередь ✓", "队列-dest", "x" * 200
    _publish(a.url, src, 30)
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = conn.channel()
    ch.exchange_declare(exchange, "fanout", durable=True)
    ch.queue_declare("from-long", durable=True)
    ch.queue_bind("from-long", exchange)
    conn.close()
    engine.apply("utf8", {"src-uri": a.url, "src-queue": src, "dest-uri": b.url, "dest-queue": dst,
                          "src-delete-after": 20})
    deadline = time.monotonic() + 15
    while ("/", "utf8") not in engine.finished and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ("/", "utf8") in engine.finished
    assert [int(body) for _, body in _drain(b.url, dst, 20)] == list(range(20))
    long_name = "перенос-" + "ш" * 150  # its consumer tag, "shovel-" and the name, is cut to 255 bytes
    engine.apply(long_name, {"src-uri": a.url, "src-queue": src, "dest-uri": b.url, "dest-exchange": exchange})
    engine.wait_state(long_name, "running")
    assert sorted(int(body) for _, body in _drain(b.url, "from-long", 10)) == list(range(20, 30))
    engine.remove(long_name)


def test_missing_source_is_terminated_and_retried(two_brokers, engine) -> None:
    a, b = two_brokers
    engine.apply("nosrc", {"src-uri": a.url, "src-queue": "not-yet", "dest-uri": b.url, "dest-queue": "d",
                           "reconnect-delay": 0.2})
    row = engine.wait_state("nosrc", "terminated")
    assert "not-yet" in row["reason"] and "404" in row["reason"]
    _publish(a.url, "not-yet", 5)
    engine.wait_state("nosrc", "running", timeout=10)
    assert len(_drain(b.url, "d", 5)) == 5
    engine.remove("nosrc")


def test_unreachable_uris_tried_in_turn(two_brokers, engine) -> None:
    a, b = two_brokers
    _publish(a.url, "turn", 3)
    dead = "amqp://guest:guest@127.0.0.1:1/"
    engine.apply("turn", {"src-uri": [dead, a.url], "src-queue": "turn", "dest-uri": b.url, "dest-queue": "t2"})
    row = engine.wait_state("turn", "running")
    assert row["src_uri"] == a.url.replace("guest:guest", "guest:***")
    assert len(_drain(b.url, "t2", 3)) == 3
    engine.remove("turn")


def test_destination_restart_loses_nothing(two_brokers, engine) -> None:
    a, b = two_brokers
    _publish(a.url, "r", 2000)
    engine.apply("r", {"src-uri": a.url, "src-queue": "r", "dest-uri": b.url, "dest-queue": "r2",
                       "reconnect-delay": 0.2, "src-prefetch-count": 100})
    engine.wait_state("r", "running")
    b.kill9()
    row = engine.wait_state("r", "terminated")
    assert "destination" in row["reason"]
    b.start()
    engine.wait_state("r", "running", timeout=15)
    deadline = time.monotonic() + 20
    while _count(a.url, "r") and time.monotonic() < deadline:
        time.sleep(0.1)
    bodies = [int(body) for _, body in _drain(b.url, "r2", 10**9, timeout=2)]
    assert set(bodies) == set(range(2000))


def _redelivered(broker, queue: str) -> int:
    request = urllib.request.Request(f"{broker.http_url}/api/queues/%2F/{queue}")
    request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.load(reply).get("message_stats", {}).get("redeliver", 0)


def test_a_restart_waits_for_the_destinations_confirms_and_moves_nothing_twice(two_brokers, engine) -> None:
    # The destination is stopped while the shovel forwards: its confirms are held back when the shovel
    # restarts. The old session waits for them (the destination resumes meanwhile) and acks at the source,
    # so nothing goes back to the source queue to be moved again by the new session.
    a, b = two_brokers
    _publish(a.url, "held", 0)
    engine.apply("held", {"src-uri": a.url, "src-queue": "held", "dest-uri": b.url, "dest-queue": "held",
                          "reconnect-delay": 0.2})
    engine.wait_state("held", "running")
    os.kill(b.pid, signal.SIGSTOP)
    try:
        _publish(a.url, "held", 5)
        deadline = time.monotonic() + 10
        while engine.status("held")["forwarded"] < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert engine.status("held")["forwarded"] == 5
        engine.call(lambda: engine.shovels.restart("/", "held"))
        time.sleep(0.3)
    finally:
        os.kill(b.pid, signal.SIGCONT)
    engine.wait_state("held", "running", timeout=15)
    deadline = time.monotonic() + 10
    while _count(b.url, "held") < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # (a second copy would come now)
    assert _count(b.url, "held") == 5
    assert _count(a.url, "held") == 0
    assert _redelivered(a, "held") == 0


@pytest.mark.parametrize(("value", "key"), [
    ({"src-queue": "q", "dest-uri": "amqp://", "dest-queue": "d"}, "src-uri"),
    ({"src-uri": "http://x", "src-queue": "q", "dest-uri": "amqp://"}, "src-uri"),
    ({"src-uri": "amqp://", "dest-uri": "amqp://"}, "src-queue"),
    ({"src-uri": "amqp://", "src-queue": "q", "src-exchange": "x", "dest-uri": "amqp://"}, "src-queue"),
    ({"src-uri": "amqp://", "src-queue": "q", "dest-uri": "amqp://", "ack-mode": "sometimes"}, "ack-mode"),
    ({"src-uri": "amqp://", "src-queue": "q", "dest-uri": "amqp://", "src-prefetch-count": 0}, "src-prefetch-count"),
    ({"src-uri": "amqp://", "src-queue": "q", "dest-uri": "amqp://", "src-delete-after": "later"},
     "src-delete-after"),
    ({"src-uri": "amqp://", "src-queue": "q", "dest-uri": "amqp://", "reconnect-delay": -1}, "reconnect-delay"),
    ({"src-uri": "amqp://", "src-queue": "q", "dest-uri": "amqp://", "dest-add-forward-headers": "yes"},
     "dest-add-forward-headers"),
    ({"src-uri": "amqp://", "src-queue": "q", "dest-uri": "amqp://", "dest-publish-properties": {"colour": 1}},
     "dest-publish-properties"),
    ({"src-uri": "amqp://", "src-queue": "q", "dest-uri": "amqp://", "dest-publish-properties": {"priority": 300}},
     "dest-publish-properties"),
    ({"src-uri": "amqp://", "src-queue": "q", "dest-uri": "amqp://", "src-protocol": "amqp10"}, "src-protocol"),
    ({"src-uri": "amqp://", "src-queue": "q", "dest-uri": "amqp://", "bogus-key": 1}, "bogus-key"),
    ({"src-uri": "amqp://", "src-exchange": "x", "dest-uri": "amqp://", "src-delete-after": "queue-length"},
     "src-delete-after"),
])
def test_malformed_definitions_name_the_key(value: dict, key: str) -> None:
    with pytest.raises(ShovelDefinitionError, match=key):
        parse_definition(value)


def test_old_key_names_accepted() -> None:
    d = parse_definition({"src-uri": "amqp://", "src-queue": "q", "dest-uri": "amqp://", "prefetch-count": 7,
                          "delete-after": 3, "add-forward-headers": True})
    assert (d.prefetch_count, d.delete_after, d.add_forward_headers) == (7, 3, True)


def test_destination_channel_closed_restarts_the_shovel(two_brokers, engine) -> None:
    a, b = two_brokers
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    conn.channel().exchange_declare("goes-away", "fanout")
    conn.close()
    _publish(a.url, "gone-src", 1)
    engine.apply("gone", {"src-uri": a.url, "src-queue": "gone-src", "dest-uri": b.url, "dest-exchange": "goes-away",
                          "reconnect-delay": 0.2})
    engine.wait_state("gone", "running")
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    conn.channel().exchange_delete("goes-away")
    conn.close()
    _publish(a.url, "gone-src", 1)  # its publish to the deleted exchange closes the shovel's channel (404)
    row = engine.wait_state("gone", "terminated")
    assert "goes-away" in row["reason"], row
    assert _count(a.url, "gone-src") == 1  # not acked: still at the source
    engine.remove("gone")
