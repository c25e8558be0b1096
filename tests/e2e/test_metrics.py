"""Prometheus metrics on prometheus_port: format, RabbitMQ names, counters moving with traffic."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
import uuid

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
    assert samples and samples <= helps, samples - helps


def test_metrics_parse_with_help_and_type_and_default_prefix(broker):
    text, families = _scrape(broker)
    _every_family_has_help_and_type(text)
    assert all(name.startswith("lavinpy_") for name in families)
    for name in ("lavinpy_identity_info", "lavinpy_build_info", "lavinpy_process_resident_memory_bytes",
                 "lavinpy_disk_space_available_bytes", "lavinpy_alarms_memory_used_watermark",
                 "lavinpy_alarms_free_disk_space_watermark", "lavinpy_connections", "lavinpy_queue_messages_ready"):
        assert name in families, name
    assert _value(families, "lavinpy_process_resident_memory_bytes") > 0
    assert _value(families, "lavinpy_alarms_free_disk_space_watermark") == 0


def test_rabbitmq_prefix_gives_rabbitmq_names(broker):
    text, families = _scrape(broker, "/metrics?prefix=rabbitmq")
    _every_family_has_help_and_type(text)
    assert all(name.startswith("rabbitmq_") for name in families)
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
    assert _value(families, "lavinpy_detailed_queue_delivered_ack", vhost="/", queue=queue) == 1
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
