"""Quorum-queue priorities over TCP with pika (RabbitMQ 4.3's: strict 0-31, no priority = 4)."""

from __future__ import annotations

import pika

from . import uid
from .conftest import lavinpy_only

pytestmark = lavinpy_only("RabbitMQ before 4.3 serves quorum-queue priorities in two levels")


def test_quorum_queue_serves_strict_priorities(clients):
    conn, ch = clients.channel()
    queue = clients.track_queue(uid("qq-prio"))
    ch.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
    ch.confirm_delivery()
    for body, priority in [("low", 1), ("none", None), ("top", 31), ("mid", 9), ("four", 4), ("zero", 0)]:
        ch.basic_publish("", queue, body.encode(), pika.BasicProperties(priority=priority, delivery_mode=2))
    got = []
    while True:
        method, _, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            break
        got.append(body.decode())
    assert got == ["top", "mid", "none", "four", "low", "zero"]
