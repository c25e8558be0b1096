"""Message statistics and the read-only views of the management API (real HTTP, real broker)."""

from __future__ import annotations

import time
import urllib.parse
import uuid

import pika
import pytest

from .conftest import http_call, lavinpy_only, make_admin


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _wait_for(predicate, timeout: float = 10.0, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def restart_with_config(b, text: str) -> None:
    """Restart a test's own broker with settings from a config file."""
    _wait_for(lambda: http_call(b, "GET", "/api/overview")[0] == 200)  # fully started: signals handled
    b.stop()
    config = b.workdir / "settings.yaml"
    config.write_text(text)
    b.extra_args = ["--config", str(config)]
    b.start()


def _overview(broker) -> dict:
    status, body, _ = http_call(broker, "GET", "/api/overview")
    assert status == 200, body
    return body


def test_overview_fields(broker):
    body = _overview(broker)
    for key in ("management_version", "rabbitmq_version", "product_name", "product_version", "cluster_name",
                "node", "object_totals", "queue_totals", "message_stats", "listeners", "contexts"):
        assert key in body, key
    assert {"connections", "channels", "consumers", "exchanges", "queues"} <= set(body["object_totals"])
    ports = {(item["protocol"], item["port"]) for item in body["listeners"]}
    assert ("amqp", broker.port) in ports and ("http", broker.http_port) in ports


def test_message_counters_move_with_traffic(broker, clients):
    before = _overview(broker)["message_stats"]
    _, ch = clients.channel()
    queue = clients.track_queue(_name("stats"))
    ch.queue_declare(queue)
    ch.confirm_delivery()
    for _ in range(5):
        ch.basic_publish("", queue, b"x")
    ch.basic_publish("", _name("nowhere"), b"dropped")  # unroutable, not mandatory
    got = [ch.basic_get(queue, auto_ack=False) for _ in range(2)]
    ch.basic_ack(got[1][0].delivery_tag, multiple=True)
    ch.basic_get(queue, auto_ack=True)
    received = []
    ch.basic_consume(queue, lambda c, m, p, b: received.append(m.delivery_tag), auto_ack=True)
    ch.connection.process_data_events(time_limit=0)
    _wait_for(lambda: (ch.connection.process_data_events(time_limit=0.1), len(received) == 2)[1])

    def moved() -> dict | None:
        after = _overview(broker)["message_stats"]
        return after if after["deliver_no_ack"] - before["deliver_no_ack"] >= 2 else None

    after = _wait_for(moved)
    assert after is not None
    assert after["publish"] - before["publish"] == 6
    assert after["confirm"] - before["confirm"] == 6
    assert after["drop_unroutable"] - before["drop_unroutable"] == 1
    assert after["get"] - before["get"] == 2
    assert after["get_no_ack"] - before["get_no_ack"] == 1
    assert after["ack"] - before["ack"] == 2
    assert after["deliver_no_ack"] - before["deliver_no_ack"] == 2
    assert after["deliver_get"] - before["deliver_get"] == 5
    assert "rate" in after["publish_details"]


def test_mandatory_unroutable_is_counted_as_returned(broker, clients):
    before = _overview(broker)["message_stats"]
    _, ch = clients.channel()
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("", _name("nowhere"), b"back", mandatory=True)
    after = _overview(broker)["message_stats"]
    assert after["return_unroutable"] - before["return_unroutable"] == 1


@lavinpy_only("sets a short sample interval through the config file")
def test_rates_are_computed_from_samples(fresh_broker):
    b = fresh_broker
    restart_with_config(b, "stats_sample_interval: 0.5\n")
    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    try:
        ch = conn.channel()
        ch.queue_declare("rated")
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:  # ~100 messages a second for 1.5 s
            ch.basic_publish("", "rated", b"r")
            conn.process_data_events(time_limit=0.01)

        def rate() -> float:
            return _overview(b)["message_stats"]["publish_details"]["rate"]

        assert _wait_for(lambda: rate() > 0, timeout=3)
    finally:
        conn.close()
    # Nothing published any more: after a sample or two the rate is back to 0.
    assert _wait_for(lambda: _overview(b)["message_stats"]["publish_details"]["rate"] == 0, timeout=5)


def test_deleted_queue_keeps_its_counts_in_the_totals(broker, clients):
    _, ch = clients.channel()
    queue = _name("gone")
    ch.queue_declare(queue)
    ch.basic_publish("", queue, b"x")
    ch.basic_get(queue, auto_ack=True)
    before = _overview(broker)["message_stats"]
    ch.queue_delete(queue)
    after = _overview(broker)["message_stats"]
    assert after["get_no_ack"] >= before["get_no_ack"]
    assert after["publish"] >= before["publish"]


def test_nodes(broker):
    status, nodes, _ = http_call(broker, "GET", "/api/nodes")
    assert status == 200 and len(nodes) == 1
    node = nodes[0]
    for key in ("name", "mem_used", "mem_limit", "mem_alarm", "fd_used", "disk_free", "disk_free_limit",
                "disk_free_alarm", "uptime", "running"):
        assert key in node, key
    assert node["running"] is True and node["mem_used"] > 0 and node["fd_used"] > 0 and node["uptime"] > 0
    assert node["mem_alarm"] is False and node["disk_free_alarm"] is False
    status, one, _ = http_call(broker, "GET", "/api/nodes/" + urllib.parse.quote(node["name"], safe=""))
    assert status == 200 and one["name"] == node["name"]
    status, body, _ = http_call(broker, "GET", "/api/nodes/rabbit@nowhere")
    assert status == 404 and body["error"] == "Object Not Found"


def _find_connection(broker, client_port: int) -> dict | None:
    status, conns, _ = http_call(broker, "GET", "/api/connections")
    assert status == 200
    return next((c for c in conns if c["peer_port"] == client_port), None)


def _local_port(conn: pika.BlockingConnection) -> int:
    return conn._impl._transport._sock.getsockname()[1]


def test_connections_channels_consumers(broker, clients):
    _, ch = clients.channel()
    queue = clients.track_queue(_name("consumed"))
    ch.queue_declare(queue)
    ch.basic_qos(prefetch_count=7)
    ch.basic_consume(queue, lambda *a: None, consumer_tag="ctag-" + queue)
    info = _find_connection(broker, _local_port(ch.connection))
    assert info is not None
    assert info["user"] == "guest" and info["vhost"] == "/" and info["channels"] == 1
    assert info["protocol"] == "AMQP 0-9-1" and info["state"] == "running"
    assert info["name"] == f"127.0.0.1:{info['peer_port']} -> 127.0.0.1:{broker.port}"
    assert info["client_properties"]["product"]
    quoted = urllib.parse.quote(info["name"], safe="")
    status, one, _ = http_call(broker, "GET", f"/api/connections/{quoted}")
    assert status == 200 and one["name"] == info["name"]
    status, chans, _ = http_call(broker, "GET", f"/api/connections/{quoted}/channels")
    assert status == 200 and len(chans) == 1 and chans[0]["number"] == ch.channel_number
    assert chans[0]["consumer_count"] == 1 and chans[0]["prefetch_count"] == 7
    status, all_chans, _ = http_call(broker, "GET", "/api/channels")
    assert chans[0]["name"] in {c["name"] for c in all_chans}
    status, in_vhost, _ = http_call(broker, "GET", "/api/vhosts/%2F/connections")
    assert status == 200 and info["name"] in {c["name"] for c in in_vhost}
    status, consumers, _ = http_call(broker, "GET", "/api/consumers/%2F")
    mine = [c for c in consumers if c["consumer_tag"] == "ctag-" + queue]
    assert status == 200 and len(mine) == 1
    assert mine[0]["queue"] == {"name": queue, "vhost": "/"} and mine[0]["ack_required"] is True
    assert mine[0]["channel_details"]["connection_name"] == info["name"]
    status, everywhere, _ = http_call(broker, "GET", "/api/consumers")
    assert any(c["consumer_tag"] == "ctag-" + queue for c in everywhere)


def test_unknown_connection_is_404(broker):
    status, body, _ = http_call(broker, "GET", "/api/connections/" + urllib.parse.quote("1.2.3.4:5 -> 6.7.8.9:1"))
    assert status == 404 and body["error"] == "Object Not Found"


def test_delete_connection_closes_it_with_320_and_the_reason(broker, clients):
    conn = clients.connect()
    info = _find_connection(broker, _local_port(conn))
    assert info is not None
    quoted = urllib.parse.quote(info["name"], safe="")
    status, _, _ = http_call(broker, "DELETE", f"/api/connections/{quoted}", headers={"X-Reason": "maintenance now"})
    assert status == 204
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        for _ in range(50):
            conn.process_data_events(time_limit=0.1)
    assert closed.value.reply_code == 320
    assert closed.value.reply_text == "CONNECTION_FORCED - maintenance now"
    assert _wait_for(lambda: _find_connection(broker, info["peer_port"]) is None)
    _, other = clients.channel()  # the broker and other clients go on
    other.queue_declare("", exclusive=True)


@lavinpy_only("makes users in the data dir")
def test_management_user_sees_only_own_connections_and_no_nodes(fresh_broker, fresh_clients):
    admin = make_admin(fresh_broker)
    admin.add_user("watcher", "pw", ("management",))
    admin.set_permissions("watcher", "/", ".*", ".*", ".*")
    admin.apply()
    guest_conn = fresh_clients.connect()
    watcher_conn = fresh_clients.connect(fresh_broker.url_for("watcher", "pw"))
    status, conns, _ = http_call(fresh_broker, "GET", "/api/connections", user="watcher", password="pw")
    assert status == 200
    assert {c["user"] for c in conns} == {"watcher"}
    assert {c["peer_port"] for c in conns} == {_local_port(watcher_conn)}
    status, body, _ = http_call(fresh_broker, "GET", "/api/nodes", user="watcher", password="pw")
    assert status == 401 and body == {"error": "not_authorised", "reason": "Not monitor user"}
    # It may not close the guest's connection, which it cannot even see.
    guest_info = _find_connection(fresh_broker, _local_port(guest_conn))
    quoted = urllib.parse.quote(guest_info["name"], safe="")
    status, _, _ = http_call(fresh_broker, "DELETE", f"/api/connections/{quoted}", user="watcher", password="pw")
    assert status == 404
    assert guest_conn.is_open


def test_health_checks(broker):
    for path in ("/api/health/checks/alarms", "/api/health/checks/local-alarms",
                 "/api/health/checks/virtual-hosts", f"/api/health/checks/port-listener/{broker.port}"):
        status, body, _ = http_call(broker, "GET", path)
        assert status == 200 and body["status"] == "ok", (path, body)
    status, body, _ = http_call(broker, "GET", "/api/health/checks/port-listener/1")
    assert status == 503 and body["status"] == "failed" and body["reason"]


@lavinpy_only("sets a disk limit above the free space")
def test_alarm_health_check_fails_while_the_disk_alarm_is_raised(fresh_broker):
    b = fresh_broker
    restart_with_config(b, "disk_free_limit: 1000000000000000\n")
    status, body, _ = http_call(b, "GET", "/api/health/checks/alarms")
    assert status == 503 and body["status"] == "failed"
    assert body["alarms"][0]["resource"] == "disk"
    status, nodes, _ = http_call(b, "GET", "/api/nodes")
    assert nodes[0]["disk_free_alarm"] is True


def test_aliveness_test(broker):
    status, body, _ = http_call(broker, "GET", "/api/aliveness-test/%2F")
    assert status == 200 and body == {"status": "ok"}
    status, body, _ = http_call(broker, "GET", "/api/aliveness-test/%2F")  # again: the queue exists
    assert status == 200 and body == {"status": "ok"}
    status, body, _ = http_call(broker, "GET", "/api/aliveness-test/no-such-vhost")
    assert status == 404


def test_queue_and_exchange_message_stats(broker, clients):
    conn, ch = clients.channel()
    queue = clients.track_queue(_name("qstats"))
    exchange = clients.track_exchange(_name("xstats"))
    ch.exchange_declare(exchange, "fanout")
    ch.queue_declare(queue)
    ch.queue_bind(queue, exchange)
    for _ in range(4):
        ch.basic_publish(exchange, "", b"q")
    method, _, _ = ch.basic_get(queue, auto_ack=False)
    ch.basic_reject(method.delivery_tag, requeue=False)
    ch.basic_get(queue, auto_ack=True)
    conn.process_data_events(time_limit=0)
    status, info, _ = http_call(broker, "GET", f"/api/queues/%2F/{queue}")
    assert status == 200
    stats = info["message_stats"]
    assert stats["publish"] == 4 and stats["get"] == 1 and stats["get_no_ack"] == 1
    assert stats["reject"] == 1 and stats["deliver_get"] == 2 and "rate" in stats["publish_details"]
    status, info, _ = http_call(broker, "GET", f"/api/exchanges/%2F/{exchange}")
    assert status == 200
    assert info["message_stats"]["publish_in"] == 4 and info["message_stats"]["publish_out"] == 4
    # A publish through the API counts as one, as RabbitMQ's management publish does.
    status, _, _ = http_call(broker, "POST", f"/api/exchanges/%2F/{exchange}/publish",
                             {"properties": {}, "routing_key": "", "payload": "h", "payload_encoding": "string"})
    assert status == 200
    status, info, _ = http_call(broker, "GET", f"/api/exchanges/%2F/{exchange}")
    assert info["message_stats"]["publish_in"] == 5


def test_long_queue_list_is_complete_and_pages(broker, clients):
    """More queues than one encoding slice: the list and its pages are whole and valid JSON."""
    _, ch = clients.channel()
    prefix = _name("many")
    names = [clients.track_queue(f"{prefix}-{n:03d}") for n in range(600)]
    for name in names:
        ch.queue_declare(name)
    status, listed, _ = http_call(broker, "GET", f"/api/queues/%2F?name={prefix}")
    assert status == 200 and sorted(q["name"] for q in listed) == names
    status, page, _ = http_call(broker, "GET", f"/api/queues/%2F?name={prefix}&page=2&page_size=250&sort=name")
    assert status == 200
    assert page["filtered_count"] == 600 and page["page_count"] == 3 and page["item_count"] == 250
    assert [q["name"] for q in page["items"]] == names[250:500]
