"""Prometheus metrics on prometheus_port: format, RabbitMQ names, counters moving with traffic."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
import uuid

import pika
from prometheus_client.parser import text_string_to_metric_families

from .conftest import lavinpy_only

pytestmark = lavinpy_only("the Prometheus endpoint of a lavinpy started by the tests")


def _scrape(broker, path: str = "/metrics") -> tuple[str, dict]:
    with urllib.request.urlopen(broker.metrics_url + path, timeout=30) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    return text, families


def _value(families: dict, name: str, **labels: str) -> float:
    family = families[name]
    for sample in family.samples:
        if all(sample.labels.get(k) == v for k, v in labels.items()) and not sample.name.endswith("_created"):
            return sample.value
    raise KeyError((name, labels))


def _every_family_has_help_and_type(text: str) -> None:
    helps = {line.split()[2] for line in text.splitlines() if line.startswith("# HELP ")}
    types = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    samples = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    assert helps == types
    histograms = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ") and
                  line.split()[3] == "histogram"}
    # A histogram's samples are <name>_bucket, _sum and _count under the one family's HELP and TYPE.
    samples = {s.rsplit("_", 1)[0] if s.rsplit("_", 1)[0] in histograms else s for s in samples}
    assert samples and samples <= helps, samples - helps


def test_metrics_parse_with_help_and_type_and_default_prefix(broker):
    text, families = _scrape(broker)
    _every_family_has_help_and_type(text)
    assert all(name.startswith(("lavinpy_", "process_")) for name in families)
    for name in ("lavinpy_identity_info", "lavinpy_build_info", "lavinpy_process_resident_memory_bytes",
                 "lavinpy_disk_space_available_bytes", "lavinpy_alarms_memory_used_watermark",
                 "lavinpy_alarms_free_disk_space_watermark", "lavinpy_connections", "lavinpy_queue_messages_ready"):
        assert name in families, name
    assert _value(families, "lavinpy_process_resident_memory_bytes") > 0
    assert _value(families, "lavinpy_alarms_free_disk_space_watermark") == 0


def test_rabbitmq_prefix_gives_rabbitmq_names(broker):
    text, families = _scrape(broker, "/metrics?prefix=rabbitmq")
    _every_family_has_help_and_type(text)
    # The process's own families keep the standard unprefixed names, as in RabbitMQ's output.
    assert all(name.startswith(("rabbitmq_", "process_")) for name in families)
    # Names RabbitMQ's Grafana "RabbitMQ-Overview" dashboard queries (counters parse without _total).
    for name in ("rabbitmq_identity_info", "rabbitmq_build_info", "rabbitmq_queue_messages_ready",
                 "rabbitmq_queue_messages_unacked", "rabbitmq_connections", "rabbitmq_channels", "rabbitmq_consumers",
                 "rabbitmq_queues", "rabbitmq_process_resident_memory_bytes", "rabbitmq_resident_memory_limit_bytes",
                 "rabbitmq_disk_space_available_bytes", "rabbitmq_process_open_fds", "rabbitmq_process_max_fds",
                 "rabbitmq_channel_messages_published", "rabbitmq_channel_messages_confirmed",
                 "rabbitmq_channel_messages_unroutable_dropped", "rabbitmq_channel_messages_unroutable_returned",
                 "rabbitmq_channel_messages_delivered_ack", "rabbitmq_channel_messages_acked",
                 "rabbitmq_global_messages_received", "rabbitmq_global_messages_dead_lettered_rejected"):
        assert name in families, name
    assert families["rabbitmq_channel_messages_published"].type == "counter"
    identity = families["rabbitmq_identity_info"].samples[0]
    assert identity.labels["rabbitmq_node"] and identity.value == 1


def test_counters_move_after_publishing(broker, clients):
    _, before = _scrape(broker)
    conn, ch = clients.channel()
    queue = clients.track_queue(f"metrics-{uuid.uuid4().hex[:8]}")
    ch.queue_declare(queue)
    for _ in range(3):
        ch.basic_publish("", queue, b"m")
    ch.basic_get(queue, auto_ack=True)
    conn.process_data_events(time_limit=0)
    _, after = _scrape(broker)
    published = "lavinpy_channel_messages_published"
    assert _value(after, published) - _value(before, published) == 3
    got = "lavinpy_channel_get"
    assert _value(after, got) - _value(before, got) == 1
    assert _value(after, "lavinpy_queue_messages_ready") >= 2


def test_detailed_per_queue_with_ages(broker, clients):
    conn, ch = clients.channel()
    queue = clients.track_queue(f"detailed-{uuid.uuid4().hex[:8]}")
    ch.queue_declare(queue)
    ch.basic_publish("", queue, b"a")
    ch.basic_publish("", queue, b"b")
    ch.basic_qos(prefetch_count=1)
    ch.basic_consume(queue, lambda *a: None)  # one delivery, never acked
    conn.process_data_events(time_limit=0.3)
    time.sleep(1.2)
    text, families = _scrape(broker, "/metrics/detailed?family=queue_coarse_metrics&family=queue_metrics"
                                     "&family=queue_delivery_metrics&vhost=%2F")
    _every_family_has_help_and_type(text)
    assert _value(families, "lavinpy_detailed_queue_messages_ready", vhost="/", queue=queue) == 1
    assert _value(families, "lavinpy_detailed_queue_messages_unacked", vhost="/", queue=queue) == 1
    assert _value(families, "lavinpy_detailed_queue_messages_delivered_ack", vhost="/", queue=queue) == 1
    assert _value(families, "lavinpy_detailed_queue_head_message_age_seconds", vhost="/", queue=queue) >= 1.0
    assert _value(families, "lavinpy_detailed_queue_oldest_unacked_age_seconds", vhost="/", queue=queue) >= 0.5
    assert "lavinpy_detailed_queue_consumers" not in families  # a family not asked for
    _, other = _scrape(broker, "/metrics/detailed?family=queue_coarse_metrics&vhost=no-such-vhost")
    assert not other["lavinpy_detailed_queue_messages_ready"].samples


def test_unknown_family_is_ignored_and_bad_prefix_is_400(broker):
    # RabbitMQ ignores a family it does not know: one scrape config serves brokers of several versions.
    _, known = _scrape(broker, "/metrics/detailed?family=queue_consumer_count")
    assert set(known) == {"lavinpy_detailed_queue_consumers"}
    _, mixed = _scrape(broker, "/metrics/detailed?family=nonsense&family=queue_consumer_count")
    assert set(mixed) == set(known)
    text, nothing = _scrape(broker, "/metrics/detailed?family=nonsense")
    assert nothing == {} and text == ""
    try:
        urllib.request.urlopen(broker.metrics_url + "/metrics?prefix=1bad", timeout=10)
        raise AssertionError("expected 400 for a prefix that is no metric name")
    except urllib.error.HTTPError as e:
        assert e.code == 400


def test_dead_lettered_counter_by_reason(broker, clients):
    _, before = _scrape(broker)
    conn, ch = clients.channel()
    dlq = clients.track_queue(f"dlq-{uuid.uuid4().hex[:8]}")
    source = clients.track_queue(f"src-{uuid.uuid4().hex[:8]}")
    ch.queue_declare(dlq)
    ch.queue_declare(source, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    ch.basic_publish("", source, b"bad")
    method, _, _ = ch.basic_get(source, auto_ack=False)
    ch.basic_reject(method.delivery_tag, requeue=False)
    assert ch.basic_get(dlq, auto_ack=True)[2] == b"bad"
    _, after = _scrape(broker)
    name = "lavinpy_global_messages_dead_lettered_rejected"
    assert _value(after, name) - _value(before, name) == 1
    expired = "lavinpy_global_messages_dead_lettered_expired"
    assert _value(after, expired) == _value(before, expired)
    _, detailed = _scrape(broker, "/metrics/detailed?family=queue_delivery_metrics")
    per_queue = "lavinpy_detailed_queue_messages_dead_lettered"
    assert _value(detailed, per_queue, vhost="/", queue=source, reason="rejected") == 1
    assert not [s for s in detailed[per_queue].samples if s.labels["queue"] == dlq]  # none: no series


def _counts(families: dict, name: str) -> float:
    return _value(families, name, protocol="amqp091")


def test_churn_get_empty_publishers_and_confirm_families(broker, clients):
    prefix = "/metrics?prefix=rabbitmq"
    _, before = _scrape(broker, prefix)
    conn, ch = clients.channel()
    ch.confirm_delivery()
    queue = clients.track_queue(f"churn-{uuid.uuid4().hex[:8]}")
    ch.queue_declare(queue)
    ch.queue_declare(queue)  # a redeclare: declared, not created
    for _ in range(4):
        ch.basic_publish("", queue, b"x" * 150)  # 150 bytes: the 1000-byte bucket, not the 100-byte one
    ch.basic_get(queue, auto_ack=True)
    consumer_ch = conn.channel()
    consumer_ch.basic_consume(queue, lambda *a: None, auto_ack=False)
    conn.process_data_events(time_limit=0.2)
    empty_queue = clients.track_queue(f"empty-{uuid.uuid4().hex[:8]}")
    ch.queue_declare(empty_queue)
    assert ch.basic_get(empty_queue, auto_ack=True) == (None, None, None)
    assert ch.basic_get(empty_queue, auto_ack=True) == (None, None, None)
    ch.queue_delete(empty_queue)
    _, during = _scrape(broker, prefix)

    def delta(name: str) -> float:
        return _value(during, name) - _value(before, name)

    assert delta("rabbitmq_queues_declared") == 3
    assert delta("rabbitmq_queues_created") == 2
    assert delta("rabbitmq_queues_deleted") == 1
    assert delta("rabbitmq_connections_opened") >= 1
    assert delta("rabbitmq_channels_opened") >= 2
    empty = "rabbitmq_global_messages_get_empty"
    classic = {"protocol": "amqp091", "queue_type": "rabbit_classic_queue"}
    assert _value(during, empty, **classic) - _value(before, empty, **classic) == 2
    assert delta("rabbitmq_channel_get_empty") == 2
    assert _counts(during, "rabbitmq_global_publishers") >= 1
    assert _counts(during, "rabbitmq_global_consumers") >= 1
    received = "rabbitmq_global_messages_received_confirm"
    assert _counts(during, received) - _counts(before, received) == 4
    sizes = during["rabbitmq_message_size_bytes"]
    assert sizes.type == "histogram"
    buckets = {s.labels["le"]: s.value for s in sizes.samples if s.name.endswith("_bucket")}
    old = {s.labels["le"]: s.value for s in before["rabbitmq_message_size_bytes"].samples
           if s.name.endswith("_bucket")}
    assert set(buckets) == {"100.0", "1000.0", "10000.0", "100000.0", "1e+06", "1e+07", "5e+07", "1e+08", "+Inf"}
    assert buckets["1000.0"] - old["1000.0"] == 4 and buckets["100.0"] == old["100.0"]
    size_sum = [s.value for s in sizes.samples if s.name.endswith("_sum")][0]
    assert size_sum >= 600

    before_close = during
    conn.close()
    clients.connections.remove(conn)
    time.sleep(0.3)
    _, after = _scrape(broker, prefix)
    assert _value(after, "rabbitmq_connections_closed") - _value(before_close, "rabbitmq_connections_closed") >= 1
    assert _value(after, "rabbitmq_channels_closed") - _value(before_close, "rabbitmq_channels_closed") >= 2
    # The closed channel's confirm-mode publishes stay counted: the counter never goes back.
    assert _counts(after, received) >= _counts(during, received)


def test_process_fsync_and_event_loop_families(broker, clients):
    conn, ch = clients.channel()
    ch.confirm_delivery()
    queue = clients.track_queue(f"fsync-{uuid.uuid4().hex[:8]}")
    ch.queue_declare(queue, durable=True)
    ch.basic_publish("", queue, b"p", pika.BasicProperties(delivery_mode=2))  # confirmed after an fsync
    time.sleep(1.2)  # two event-loop probes
    text, families = _scrape(broker)
    _every_family_has_help_and_type(text)
    assert _value(families, "process_cpu_seconds") > 0
    assert _value(families, "process_resident_memory_bytes") > 0
    assert 0 < _value(families, "process_open_fds") < _value(families, "process_max_fds")
    assert abs(_value(families, "process_start_time_seconds") - time.time()) < 24 * 3600
    assert 0 <= _value(families, "lavinpy_event_loop_lag_seconds") < 5
    fsync = families["lavinpy_store_fsync_duration_seconds"]
    assert fsync.type == "histogram"
    count = [s.value for s in fsync.samples if s.name.endswith("_count")][0]
    assert count >= 1 and _value(families, "lavinpy_io_sync_ops") == count
    identity = families["lavinpy_identity_info"].samples[0]
    assert identity.labels["rabbitmq_endpoint"] == "aggregated"


def test_message_sizes_count_each_message_once_on_every_publish_path(broker, clients):
    # Back-to-back publishes reach the broker in batches, most of them published as runs; a run the
    # model refuses goes one by one. Either way each message is counted exactly once.
    def sizes() -> tuple[float, float]:
        _, families = _scrape(broker)
        samples = families["lavinpy_message_size_bytes"].samples
        small = [s.value for s in samples if s.name.endswith("_bucket") and s.labels["le"] == "100.0"][0]
        count = [s.value for s in samples if s.name.endswith("_count")][0]
        return small, count

    conn, ch = clients.channel()
    queue = clients.track_queue(f"sizes-{uuid.uuid4().hex[:8]}")
    ch.queue_declare(queue)
    small_before, count_before = sizes()
    for _ in range(300):
        ch.basic_publish("", queue, b"s" * 60)
    deadline = time.monotonic() + 10
    while ch.queue_declare(queue, passive=True).method.message_count < 300 and time.monotonic() < deadline:
        time.sleep(0.05)
    small_after, count_after = sizes()
    assert (small_after - small_before, count_after - count_before) == (300, 300)


def test_delivery_counters_by_queue_type_survive_deleting_the_stream(broker, clients):
    name = "rabbitmq_global_messages_delivered_consume_manual_ack"
    stream = {"protocol": "amqp091", "queue_type": "rabbit_stream_queue"}
    classic = {"protocol": "amqp091", "queue_type": "rabbit_classic_queue"}
    _, before = _scrape(broker, "/metrics?prefix=rabbitmq")
    conn, ch = clients.channel()
    queue = f"typed-{uuid.uuid4().hex[:8]}"
    ch.queue_declare(queue, durable=True, arguments={"x-queue-type": "stream"})
    for i in range(3):
        ch.basic_publish("", queue, str(i).encode())
    ch.basic_qos(prefetch_count=10)
    got = []
    ch.basic_consume(queue, lambda c, m, p, b: (got.append(b), c.basic_ack(m.delivery_tag)),
                     arguments={"x-stream-offset": "first"})
    deadline = time.monotonic() + 10
    while len(got) < 3 and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.1)
    assert len(got) == 3
    _, during = _scrape(broker, "/metrics?prefix=rabbitmq")
    assert _value(during, name, **stream) - _value(before, name, **stream) == 3
    assert _value(during, name, **classic) == _value(before, name, **classic)
    ch.queue_delete(queue)
    _, after = _scrape(broker, "/metrics?prefix=rabbitmq")
    # A deleted stream's deliveries stay the stream type's: no counter goes back, none jumps.
    assert _value(after, name, **stream) == _value(during, name, **stream)
    assert _value(after, name, **classic) == _value(during, name, **classic)
