"""The message-size histogram over AMQP: bodies of known sizes, published alone, in runs of one size
and in runs that straddle the bucket bounds, land in RabbitMQ's buckets with an exact sum and count."""

from __future__ import annotations

import time
import urllib.request
import uuid

import pika
from prometheus_client.parser import text_string_to_metric_families

from .conftest import lavinpy_only

pytestmark = lavinpy_only("the Prometheus endpoint of a lavinpy started by the tests")

# RabbitMQ's bounds (bytes); a bound belongs to its own bucket (le).
BOUNDS = ("100.0", "1000.0", "10000.0", "100000.0", "1e+06", "1e+07", "5e+07", "1e+08", "+Inf")
LIMITS = (100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000, 50_000_000, 100_000_000)


def _histogram(broker) -> tuple[dict[str, float], float, float]:
    """(cumulative count per bound, sum, count) of rabbitmq_message_size_bytes."""
    with urllib.request.urlopen(broker.metrics_url + "/metrics?prefix=rabbitmq", timeout=30) as response:
        text = response.read().decode()
    family = {f.name: f for f in text_string_to_metric_families(text)}["rabbitmq_message_size_bytes"]
    buckets = {s.labels["le"]: s.value for s in family.samples if s.name.endswith("_bucket")}
    total = [s.value for s in family.samples if s.name.endswith("_sum")][0]
    count = [s.value for s in family.samples if s.name.endswith("_count")][0]
    return buckets, total, count


def _expected(sizes: list[int]) -> dict[str, float]:
    return {le: float(sum(1 for size in sizes if limit is None or size <= limit))
            for le, limit in zip(BOUNDS, (*LIMITS, None), strict=True)}


def test_sizes_land_in_their_buckets_with_exact_sum_and_count(broker, clients):
    conn, ch = clients.channel()
    queue = clients.track_queue(f"sizes-{uuid.uuid4().hex[:8]}")
    ch.queue_declare(queue)
    ch.queue_bind(queue, "amq.direct", routing_key=queue)
    before, sum_before, count_before = _histogram(broker)
    assert set(before) == set(BOUNDS)
    sizes: list[int] = []

    def publish(size: int, exchange: str = "", properties: pika.BasicProperties | None = None) -> None:
        ch.basic_publish(exchange, queue, b"m" * size, properties)
        sizes.append(size)

    # Alone: each with headers (never published as part of a run).
    for size in (0, 100, 101, 1_000, 1_001, 10_000, 10_001, 100_001, 1_000_001):
        publish(size, properties=pika.BasicProperties(headers={"n": size}))
    # Back to back, one size: runs counted with one addition each.
    for _ in range(500):
        publish(16)
    for _ in range(200):
        publish(150, "amq.direct")
    # Back to back, sizes on either side of each small bound: runs counted body by body.
    for i in range(400):
        publish((99, 100, 101, 999, 1_000, 1_001, 9_999, 10_000)[i % 8])
    deadline = time.monotonic() + 30
    while ch.queue_declare(queue, passive=True).method.message_count < len(sizes) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ch.queue_declare(queue, passive=True).method.message_count == len(sizes)
    after, sum_after, count_after = _histogram(broker)
    expected = _expected(sizes)
    assert {le: after[le] - before[le] for le in BOUNDS} == expected
    assert count_after - count_before == len(sizes) == expected["+Inf"]
    assert sum_after - sum_before == sum(sizes)
