"""The broker runs the codec path LAVINPY_PURE_PYTHON selects, and says so at startup (CI runs the whole
suite once each way; this test proves which one a run exercised)."""

from __future__ import annotations

import os

import pika

from lavinpy.wire import accel

from . import uid
from .conftest import lavinpy_only


@lavinpy_only()
def test_broker_logs_the_selected_codec_path(broker) -> None:
    pure = os.environ.get("LAVINPY_PURE_PYTHON") == "1"
    assert accel.COMPILED is not pure
    started = [line for line in broker.log.splitlines() if "lavinpy started" in line]
    assert started, broker.log[-2000:]
    assert started[-1].endswith("pure-Python codec)" if pure else "compiled codec)"), started[-1]


def test_a_busy_consumer_gets_every_message_in_order(broker) -> None:
    # Well past the output after which a plain TCP connection's writes move to the writer thread
    # (compiled path): the bytes before and after the switch arrive complete and in order.
    queue = uid("order")
    count, body_size = 3000, 1500
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = conn.channel()
        ch.queue_declare(queue, auto_delete=True)
        for i in range(count):
            ch.basic_publish("", queue, i.to_bytes(4, "big") * (body_size // 4))
        received: list[bytes] = []
        for _method, _props, body in ch.consume(queue, auto_ack=True, inactivity_timeout=10):
            if body is None:
                break
            received.append(body)
            if len(received) == count:
                break
        assert [int.from_bytes(b[:4], "big") for b in received] == list(range(count))
        assert all(b == b[:4] * (body_size // 4) for b in received)
    finally:
        conn.close()
