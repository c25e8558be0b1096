"""A failover with deduplication and delayed retries in flight (real etcd, two nodes, SIGKILL): the
promoted follower refuses duplicates of every identifier the old leader confirmed (none stored twice,
on a queue's cache and on an exchange's), and each retry the old leader scheduled happens once, when
it was due."""

from __future__ import annotations

import time

import pika
import pytest

from tests.helpers import wait_until

from .harness import PREFIX, SHORT_LEASE, Cluster

pytestmark = pytest.mark.timeout(120)

RETRY_MS = 14_000  # past the failover: the lease (5 s) runs out, the follower promotes and serves
IDS = 150
ID_HEADER = "x-deduplication-header"


def _isr(cluster: Cluster) -> list[str]:
    import json
    value = cluster.etcd.get(f"{PREFIX}/isr")
    return json.loads(value[0]) if value else []


def _publish_ids(channel, exchange: str, routing_key: str, ids: range) -> None:
    """Each with its identifier, confirmed (pika raises on a nack or return)."""
    for i in ids:
        channel.basic_publish(exchange, routing_key, f"m{i}".encode(),
                              pika.BasicProperties(delivery_mode=2, headers={ID_HEADER: f"id-{i}"}))


def _drain(channel, queue: str) -> list[bytes]:
    bodies = []
    while True:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return bodies
        bodies.append(body)


def test_failover_keeps_dedup_caches_and_retry_schedules(cluster: Cluster) -> None:
    nodes = cluster.start(2, SHORT_LEASE)
    leader = cluster.wait_for_leader(30)
    wait_until(lambda: set(_isr(cluster)) == {n.node_id for n in nodes}, 30, what="both nodes in the ISR")
    connection = pika.BlockingConnection(pika.URLParameters(leader.amqp_url))
    channel = connection.channel()
    dedup = {"x-message-deduplication": True, "x-cache-size": 1000}
    channel.queue_declare("dedup-q", durable=True, arguments={"x-queue-type": "quorum", **dedup})
    channel.exchange_declare("dedup-x", "fanout", durable=True, arguments=dedup)
    channel.queue_declare("from-x", durable=True)
    channel.queue_bind("from-x", "dedup-x")
    channel.queue_declare("retries", durable=True, arguments={
        "x-queue-type": "quorum", "x-delayed-retry-type": "all", "x-delayed-retry-min": RETRY_MS})
    channel.confirm_delivery()
    for body in (b"r1", b"r2", b"r3"):
        channel.basic_publish("", "retries", body, pika.BasicProperties(delivery_mode=2))
    rejected: list[bytes] = []

    def reject(ch, method, _props, body) -> None:
        rejected.append(body)
        ch.basic_reject(method.delivery_tag, requeue=True)

    tag = channel.basic_consume("retries", reject)
    deadline = time.monotonic() + 10
    while len(rejected) < 3 and time.monotonic() < deadline:
        connection.process_data_events(0.05)
    channel.basic_cancel(tag)
    due = time.monotonic() + RETRY_MS / 1000
    assert sorted(rejected) == [b"r1", b"r2", b"r3"]
    # Identifiers confirmed by the leader, duplicates among them: each stored once.
    _publish_ids(channel, "", "dedup-q", range(IDS))
    _publish_ids(channel, "", "dedup-q", range(IDS - 10, IDS))
    _publish_ids(channel, "dedup-x", "", range(IDS))
    assert channel.queue_declare("dedup-q", passive=True).method.message_count == IDS
    assert channel.queue_declare("retries", passive=True).method.message_count == 0  # all three wait
    connection.close()

    old, _ = cluster.kill_leader()
    new = cluster.wait_for_leader(30, exclude=old)
    assert time.monotonic() < due - 2, "the failover took longer than the retry delay: nothing to check"
    connection = pika.BlockingConnection(pika.URLParameters(new.amqp_url))
    channel = connection.channel()
    channel.confirm_delivery()
    # Every identifier again and some new ones: the duplicates are confirmed, not stored.
    _publish_ids(channel, "", "dedup-q", range(IDS + 20))
    _publish_ids(channel, "dedup-x", "", range(IDS + 20))
    assert channel.queue_declare("retries", passive=True).method.message_count == 0  # still waiting
    queue_bodies = _drain(channel, "dedup-q")
    exchange_bodies = _drain(channel, "from-x")
    expected = sorted(f"m{i}".encode() for i in range(IDS + 20))
    assert sorted(queue_bodies) == expected
    assert sorted(exchange_bodies) == expected

    arrivals: list[tuple[float, bytes, int]] = []

    def accept(ch, method, props, body) -> None:
        arrivals.append((time.monotonic(), body, (props.headers or {}).get("x-delivery-count")))
        ch.basic_ack(method.delivery_tag)

    channel.basic_consume("retries", accept)
    deadline = due + 6
    while len(arrivals) < 3 and time.monotonic() < deadline:
        connection.process_data_events(0.05)
    connection.process_data_events(1.0)  # a second copy of any would arrive now
    connection.close()
    assert sorted(body for _, body, _ in arrivals) == [b"r1", b"r2", b"r3"], arrivals
    assert all(count == 1 for _, _, count in arrivals), arrivals
    times = [at for at, _, _ in arrivals]
    assert min(times) >= due - 0.3 and max(times) <= due + 1.5, (due, times)
