"""lavinpyctl against a real broker over its management API: output formats, exit codes, object commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.parse
import uuid

import pika
import pytest

from lavinpy.wire.passwords import verify_password
from tests.helpers import free_port

from .conftest import REPO_ROOT, http_call, lavinpy_only
from .test_http_stats import restart_with_config


def ctl(broker, *args: str, user: str = "guest", password: str = "guest", uri: str | None = None,
        stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LAVINPYCTL_URI"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    if uri is None:
        parts = urllib.parse.urlsplit(broker.http_url)
        uri = f"http://{user}:{password}@{parts.hostname}:{parts.port}"
    env["LAVINPYCTL_URI"] = uri
    return subprocess.run([sys.executable, "-m", "lavinpy.cli.ctl", *args], env=env, capture_output=True,
                          text=True, timeout=60, input=stdin)


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_status_exit_codes(broker):
    done = ctl(broker, "status")
    assert done.returncode == 0, done.stderr
    assert "node: " in done.stdout and "alarms: ok" in done.stdout
    as_json = json.loads(ctl(broker, "-f", "json", "status").stdout)
    assert as_json["alarms"] == "ok"
    unreachable = ctl(broker, "status", uri=f"http://guest:guest@127.0.0.1:{free_port()}")
    assert unreachable.returncode == 69 and "cannot reach" in unreachable.stderr
    refused = ctl(broker, "status", password="wrong")
    assert refused.returncode == 1 and "401" in refused.stderr
    usage = ctl(broker, "no_such_command")
    assert usage.returncode == 64  # rabbitmqctl's EX_USAGE
    assert ctl(broker, "delete_queue").returncode == 64  # a missing argument


def test_list_queues_formats_and_vhost_option(broker, clients):
    _, ch = clients.channel()
    queue = clients.track_queue(_name("ctl"))
    ch.queue_declare(queue)
    for _ in range(3):
        ch.basic_publish("", queue, b"c")
    table = ctl(broker, "list_queues")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0] == "Listing queues for vhost / ..."  # rabbitmqctl's banner, then its tab-separated table
    assert lines[1] == "name\tmessages"
    assert f"{queue}\t3" in lines
    tsv = ctl(broker, "-f", "tsv", "list_queues", "name", "messages_ready", "consumers")
    assert tsv.stdout.splitlines()[0] == "name\tmessages_ready\tconsumers"
    assert f"{queue}\t3\t0" in tsv.stdout.splitlines()
    rows = json.loads(ctl(broker, "list_queues", "-f", "json", "-p", "/").stdout)
    assert {"name": queue, "messages": 3} in rows
    missing = ctl(broker, "list_queues", "-p", "no-such-vhost")
    assert missing.returncode == 65 and "Virtual host 'no-such-vhost' does not exist" in missing.stderr


def test_list_exchanges_bindings_connections_channels_consumers(broker, clients):
    conn, ch = clients.channel()
    queue = clients.track_queue(_name("ctlq"))
    exchange = clients.track_exchange(_name("ctlx"))
    ch.exchange_declare(exchange, "topic")
    ch.queue_declare(queue)
    ch.queue_bind(queue, exchange, "a.#")
    ch.basic_consume(queue, lambda *a: None, consumer_tag="ctl-consumer")
    exchanges = json.loads(ctl(broker, "-f", "json", "list_exchanges").stdout)
    assert {"name": exchange, "type": "topic"} in exchanges
    bindings = ctl(broker, "-f", "tsv", "list_bindings", "source", "destination", "routing_key").stdout
    assert f"{exchange}\t{queue}\ta.#" in bindings.splitlines()
    port = conn._impl._transport._sock.getsockname()[1]
    connections = json.loads(ctl(broker, "-f", "json", "list_connections", "user", "peer_port", "state").stdout)
    assert {"user": "guest", "peer_port": port, "state": "running"} in connections
    channels = json.loads(ctl(broker, "-f", "json", "list_channels").stdout)
    assert any(c["consumer_count"] == 1 and f":{port} -> " in c["name"] for c in channels)
    consumers = json.loads(ctl(broker, "-f", "json", "list_consumers").stdout)
    assert any(c["queue_name"] == queue and c["consumer_tag"] == "ctl-consumer" for c in consumers)


def test_purge_and_delete_queue(broker, clients):
    _, ch = clients.channel()
    queue = clients.track_queue(_name("ctlp"))
    ch.queue_declare(queue)
    ch.basic_publish("", queue, b"p")
    assert ctl(broker, "purge_queue", queue).returncode == 0
    assert ch.queue_declare(queue, passive=True).method.message_count == 0
    ch.basic_publish("", queue, b"p")
    not_empty = ctl(broker, "delete_queue", queue, "--if-empty")
    assert not_empty.returncode == 1 and "not empty" in not_empty.stderr
    assert ctl(broker, "delete_queue", queue).returncode == 0
    status, _, _ = http_call(broker, "GET", f"/api/queues/%2F/{queue}")
    assert status == 404


def test_close_connection_with_reason(broker, clients):
    conn = clients.connect()
    port = conn._impl._transport._sock.getsockname()[1]
    listed = json.loads(ctl(broker, "-f", "json", "list_connections", "name", "peer_port").stdout)
    name = next(c["name"] for c in listed if c["peer_port"] == port)
    done = ctl(broker, "close_connection", name, "go away")
    assert done.returncode == 0, done.stderr
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        for _ in range(50):
            conn.process_data_events(time_limit=0.1)
    assert closed.value.reply_code == 320 and closed.value.reply_text == "CONNECTION_FORCED - go away"


def test_hash_password_is_rabbitmq_sha256(broker):
    done = ctl(broker, "hash_password", "s3cret")
    assert done.returncode == 0
    digest = done.stdout.strip()
    assert verify_password("s3cret", digest, "rabbit_password_hashing_sha256")
    assert not verify_password("other", digest, "rabbit_password_hashing_sha256")


@lavinpy_only("sets a disk limit above the free space")
def test_status_reports_an_alarm_and_still_exits_0(fresh_broker):
    restart_with_config(fresh_broker, "disk_free_limit: 1000000000000000\n")
    done = ctl(fresh_broker, "status")
    assert done.returncode == 0, done.stderr
    assert "alarms: failed" in done.stdout
