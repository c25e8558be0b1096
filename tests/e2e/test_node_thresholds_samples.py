"""The broker's sample history on the API (RabbitMQ's lengths_age/msg_rates_age), the alarm thresholds
changed at run time through the API and lavinpyctl, and the blocking/blocked connection states.
Each test runs its own broker: an alarm would block every other test's publishers."""

from __future__ import annotations

import time
import urllib.parse
from typing import Any

import pika
import pytest
from pamqp import commands

from .conftest import http_call, lavinpy_only
from .rawamqp import RawAMQP
from .test_ctl import ctl
from .test_http_stats import restart_with_config

pytestmark = lavinpy_only("sample history and run-time thresholds are lavinpy's")

HUGE = "1000000TB"  # more free disk than any machine has: the disk alarm goes on


def _get(broker: Any, path: str, **kw: Any) -> Any:
    status, body, _ = http_call(broker, "GET", path, **kw)
    assert status == 200, (path, status, body)
    return body


def _wait(predicate: Any, what: str, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what} (last: {value!r})")
        time.sleep(0.1)


def wait_for_aligned_point(incr: float = 5.0, tick: float = 0.6) -> None:
    """Sleep until a sample point aligned to ``incr`` (RabbitMQ aligns them) lies after the next tick,
    so the newest point holds what the broker has now."""
    settled = time.time() + tick
    while (time.time() // incr) * incr < settled:
        time.sleep(0.1)


def _node_name(broker: Any) -> str:
    return _get(broker, "/api/nodes")[0]["name"]


def _alarms(broker: Any) -> list[str]:
    status, body, _ = http_call(broker, "GET", "/api/health/checks/alarms")
    assert status in (200, 503), body
    return sorted(a["resource"] for a in body.get("alarms", []))


def _check_samples(details: dict, newest: int | None = None) -> list[int]:
    """RabbitMQ's shape: samples newest first, timestamps in ms aligned to the increment."""
    samples = details["samples"]
    assert samples, details
    stamps = [s["timestamp"] for s in samples]
    assert stamps == sorted(stamps, reverse=True) and len(set(stamps)) == len(stamps), stamps
    assert all(isinstance(s["sample"], int) for s in samples), samples
    assert {"rate", "avg", "avg_rate"} <= set(details), details
    if newest is not None:
        assert samples[0]["sample"] == newest, samples
    return [s["sample"] for s in samples]


@pytest.fixture
def sampled_broker(fresh_broker: Any) -> Any:
    restart_with_config(fresh_broker, "stats_sample_interval: 0.5\n")  # a tick every half second
    return fresh_broker


def test_samples_on_queue_overview_and_vhosts(sampled_broker: Any) -> None:
    b = sampled_broker
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    try:
        ch = conn.channel()
        ch.queue_declare("sampled")
        ch.confirm_delivery()
        for _ in range(4):  # the depth grows over several ticks: 5, 10, 15, 20
            for _ in range(5):
                ch.basic_publish("", "sampled", b"x")
            time.sleep(1.1)
    finally:
        conn.close()
    wait_for_aligned_point()  # the newest 5-second point holds all 20

    # Without the parameters a reply carries no samples (and costs nothing more).
    assert "samples" not in str(_get(b, "/api/queues/%2F/sampled"))

    q = _get(b, "/api/queues/%2F/sampled?lengths_age=60&lengths_incr=5")
    _check_samples(q["messages_details"], newest=20)
    _check_samples(q["messages_ready_details"], newest=20)
    _check_samples(q["messages_unacknowledged_details"], newest=0)
    assert all(s["timestamp"] % 5000 == 0 for s in q["messages_details"]["samples"])

    # One-second points show the growth: the broker kept every tick, not just the last.
    fine = _check_samples(_get(b, "/api/queues/%2F/sampled?lengths_age=10&lengths_incr=1")["messages_details"],
                          newest=20)
    assert fine == sorted(fine, reverse=True) and len(set(fine)) >= 3, fine

    rates = _get(b, "/api/queues/%2F/sampled?msg_rates_age=10&msg_rates_incr=1")["message_stats"]
    published = _check_samples(rates["publish_details"], newest=20)  # cumulative counts, as RabbitMQ's
    assert published == sorted(published, reverse=True) and published[-1] < 20, published

    overview = _get(b, "/api/overview?lengths_age=60&lengths_incr=5&msg_rates_age=60&msg_rates_incr=5")
    _check_samples(overview["queue_totals"]["messages_details"], newest=20)
    assert _check_samples(overview["message_stats"]["publish_details"])[0] >= 20

    vhost = _get(b, "/api/vhosts/%2F?lengths_age=60&lengths_incr=5&msg_rates_age=60&msg_rates_incr=5")
    _check_samples(vhost["messages_details"], newest=20)
    listed = _get(b, "/api/vhosts?lengths_age=60&lengths_incr=5")
    _check_samples(next(v for v in listed if v["name"] == "/")["messages_ready_details"], newest=20)

    for bad in ("lengths_age=x", "lengths_age=60&lengths_incr=0", "msg_rates_age=-1"):
        status, body, _ = http_call(b, "GET", f"/api/queues/%2F/sampled?{bad}")
        assert status == 400, (bad, body)


def _raw_blocked_client(b: Any) -> RawAMQP:
    raw = RawAMQP(b.host, b.port)
    raw.handshake()
    return raw


def _states(b: Any) -> list[str]:
    return sorted(c["state"] for c in _get(b, "/api/connections"))


def test_thresholds_through_the_api_raise_and_clear_the_alarm(fresh_broker: Any) -> None:
    b = fresh_broker
    node = urllib.parse.quote(_node_name(b), safe="")
    assert _alarms(b) == []
    quiet = _raw_blocked_client(b)  # will never publish
    publisher = _raw_blocked_client(b)
    publisher.open_channel(1)
    try:
        status, body, _ = http_call(b, "PUT", f"/api/nodes/{node}/disk_free_limit", {"bytes": HUGE})
        assert status == 200 and body["disk_free_alarm"] is True, body
        assert _alarms(b) == ["disk"]
        assert _get(b, "/api/nodes")[0]["disk_free_alarm"] is True
        # RabbitMQ's rule: "blocking" until a connection publishes during the alarm, then "blocked".
        assert _states(b) == ["blocking", "blocking"]
        publisher.expect(commands.Connection.Blocked, 0, timeout=5)
        publisher.publish(1, "", "nowhere", b"held back")
        _wait(lambda: _states(b) == ["blocked", "blocking"], "the publisher to show blocked")

        status, body, _ = http_call(b, "PUT", f"/api/nodes/{node}/disk_free_limit", {"bytes": "50MB"})
        assert status == 200 and body["disk_free_limit"] == 50_000_000 and body["disk_free_alarm"] is False
        assert _alarms(b) == []
        _wait(lambda: _states(b) == ["running", "running"], "both connections running again")
        publisher.expect(commands.Connection.Unblocked, 0, timeout=5)

        status, body, _ = http_call(b, "PUT", f"/api/nodes/{node}/memory_high_watermark", {"absolute": "1MB"})
        assert status == 200 and body["mem_limit"] == 1_000_000 and body["mem_alarm"] is True, body
        assert _alarms(b) == ["memory"]
        status, body, _ = http_call(b, "PUT", f"/api/nodes/{node}/memory_high_watermark", {"fraction": 0.99})
        assert status == 200 and body["mem_alarm"] is False, body
        assert _alarms(b) == []
    finally:
        quiet.close()
        publisher.close()

    for path, bad in (("memory_high_watermark", {"fraction": 2}), ("memory_high_watermark", {}),
                      ("memory_high_watermark", {"fraction": 0.4, "absolute": "1GB"}),
                      ("disk_free_limit", {"bytes": "lots"}), ("disk_free_limit", {"mem_relative": -1})):
        status, body, _ = http_call(b, "PUT", f"/api/nodes/{node}/{path}", bad)
        assert status == 400, (path, bad, body)
    assert http_call(b, "PUT", "/api/nodes/no-such-node/disk_free_limit", {"bytes": 1})[0] == 404
    # Only an administrator changes them: a monitoring user may look, not touch.
    assert http_call(b, "PUT", "/api/users/watcher", {"password": "w", "tags": "monitoring"})[0] in (201, 204)
    status, _, _ = http_call(b, "PUT", f"/api/nodes/{node}/disk_free_limit", {"bytes": HUGE},
                             user="watcher", password="w")
    assert status in (401, 403) and _alarms(b) == []


def test_lavinpyctl_sets_thresholds_as_rabbitmqctl(fresh_broker: Any) -> None:
    b = fresh_broker
    done = ctl(b, "set_disk_free_limit", HUGE)
    assert done.returncode == 0, done.stderr
    assert "Setting disk free limit on" in done.stdout
    assert _alarms(b) == ["disk"]
    done = ctl(b, "set_disk_free_limit", "mem_relative", "0")
    assert done.returncode == 0, done.stderr
    assert _alarms(b) == [] and _get(b, "/api/nodes")[0]["disk_free_limit"] == 0

    done = ctl(b, "set_vm_memory_high_watermark", "absolute", "1MiB")
    assert done.returncode == 0, done.stderr
    assert _alarms(b) == ["memory"] and _get(b, "/api/nodes")[0]["mem_limit"] == 1024 * 1024
    assert "alarms: failed" in ctl(b, "status").stdout
    done = ctl(b, "set_vm_memory_high_watermark", "0.99")
    assert done.returncode == 0, done.stderr
    assert _alarms(b) == []

    # Bad usage exits with rabbitmqctl's 64; a value the broker refuses is an error, nothing changes.
    assert ctl(b, "set_vm_memory_high_watermark", "absolute").returncode == 64
    assert ctl(b, "set_vm_memory_high_watermark", "lots").returncode == 64
    assert ctl(b, "set_disk_free_limit", "mem_relative", "x").returncode == 64
    refused = ctl(b, "set_vm_memory_high_watermark", "1.5")
    assert refused.returncode != 0 and "between 0 and 1" in refused.stderr, refused
    assert _alarms(b) == []
