"""MQTT connections counted and listed everywhere AMQP ones are: the Prometheus gauge and churn
counters, /api/nodes' sockets, the overview, lavinpyctl's list_connections and list_mqtt_connections,
and rabbitmqadmin's connection list."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request

import paho.mqtt.client as mqtt
import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import http_call
from tests.e2e.test_ctl import ctl
from tests.helpers import wait_until

from .conftest import MQTTBroker, Paho, unique

RABBITMQADMIN = shutil.which("rabbitmqadmin")


def _scrape(broker: MQTTBroker) -> list:
    with urllib.request.urlopen(broker.metrics_url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    return [s for f in text_string_to_metric_families(text) for s in f.samples]


def _metrics(broker: MQTTBroker) -> dict[str, float]:
    return {s.name: s.value for s in _scrape(broker) if not s.labels}


def _by_protocol(broker: MQTTBroker, name: str) -> dict[str, float]:
    return {s.labels["protocol"]: s.value for s in _scrape(broker) if s.name == name}


def test_mqtt_connections_in_metrics_nodes_and_overview(fresh_mqtt_broker: MQTTBroker) -> None:
    b = fresh_mqtt_broker
    before = _metrics(b)
    assert before["lavinpy_connections"] == 0
    amqp = pika.BlockingConnection(pika.URLParameters(b.url))
    devices = [Paho(b.mqtt_port, unique("metrics")) for _ in range(2)]
    for device in devices:
        device.connect()
    now = wait_until(lambda: (m := _metrics(b))["lavinpy_connections"] == 3 and m, what="three connections counted")
    assert now["lavinpy_connections_opened_total"] - before["lavinpy_connections_opened_total"] == 3
    assert now["lavinpy_channels"] == 0  # MQTT connections have no channels, and pika opened none yet
    assert now["lavinpy_channels_opened_total"] == before["lavinpy_channels_opened_total"]
    assert http_call(b, "GET", "/api/nodes")[1][0]["sockets_used"] == 3
    assert http_call(b, "GET", "/api/overview")[1]["object_totals"]["connections"] == 3
    # Publishers and consumers by protocol, labelled as RabbitMQ labels them.
    assert _by_protocol(b, "lavinpy_global_publishers") == {"amqp091": 0, "mqtt311": 0}
    devices[0].subscribe("metrics/#", 1)
    devices[1].publish("metrics/x", b"x", qos=1)
    old = Paho(b.mqtt_port, unique("metrics31"), protocol=mqtt.MQTTv31)
    old.connect()
    old.subscribe("metrics/#", 0)
    amqp_channel = amqp.channel()
    amqp_channel.basic_publish("amq.topic", "metrics.y", b"y")
    amqp_channel.basic_consume(amqp_channel.queue_declare("", exclusive=True).method.queue, lambda *a: None)
    wait_until(lambda: _by_protocol(b, "lavinpy_global_publishers") == {"amqp091": 1, "mqtt310": 0, "mqtt311": 1},
               what="one publisher of each protocol that published")
    assert _by_protocol(b, "lavinpy_global_consumers") == {"amqp091": 1, "mqtt310": 1, "mqtt311": 1}
    assert _metrics(b)["lavinpy_consumers"] == 3
    old.disconnect()
    amqp_channel.close()
    wait_until(lambda: _metrics(b)["lavinpy_connections"] == 3, what="the MQTT 3.1 client uncounted")
    now = _metrics(b)
    devices[0].disconnect()
    after = wait_until(lambda: (m := _metrics(b))["lavinpy_connections"] == 2 and m, what="the closed one uncounted")
    assert after["lavinpy_connections_closed_total"] - now["lavinpy_connections_closed_total"] == 1
    assert wait_until(lambda: http_call(b, "GET", "/api/nodes")[1][0]["sockets_used"] == 2)
    devices[1].disconnect()
    amqp.close()


def test_lavinpyctl_lists_mqtt_connections(fresh_mqtt_broker: MQTTBroker) -> None:
    b = fresh_mqtt_broker
    amqp = pika.BlockingConnection(pika.URLParameters(b.url))
    client_id = unique("ctl")
    device = Paho(b.mqtt_port, client_id)
    device.connect()
    wait_until(lambda: len(http_call(b, "GET", "/api/connections")[1]) == 2, what="both connections listed")
    done = ctl(b, "-f", "json", "list_connections", "protocol", "user", "vhost", "peer_host", "state",
               "client_properties")
    assert done.returncode == 0, done.stderr
    rows = sorted(json.loads(done.stdout), key=lambda r: r["protocol"])
    assert [r["protocol"] for r in rows] == ["AMQP 0-9-1", "MQTT 3.1.1"]
    mqtt_row = rows[1]
    assert (mqtt_row["user"], mqtt_row["vhost"], mqtt_row["peer_host"], mqtt_row["state"]) == \
        ("guest", "/", "127.0.0.1", "running")
    assert mqtt_row["client_properties"]["client_id"] == client_id
    # rabbitmqctl's list_mqtt_connections: the MQTT clients only, client_id and conn_name by default
    done = ctl(b, "-f", "json", "list_mqtt_connections")
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    assert len(listed) == 1 and listed[0]["client_id"] == client_id
    assert listed[0]["conn_name"].startswith("127.0.0.1:") and listed[0]["conn_name"].endswith(f":{b.mqtt_port}")
    done = ctl(b, "-f", "json", "list_mqtt_connections", "client_id", "connection_state", "protocol", "user")
    assert json.loads(done.stdout) == [{"client_id": client_id, "connection_state": "running",
                                        "protocol": "MQTT 3.1.1", "user": "guest"}]
    assert ctl(b, "list_mqtt_connections", "nope").returncode == 64  # an unknown column, as rabbitmqctl
    device.disconnect()
    amqp.close()


@pytest.mark.skipif(RABBITMQADMIN is None, reason="rabbitmqadmin is not installed")
def test_rabbitmqadmin_lists_mqtt_connections(mqtt_broker: MQTTBroker) -> None:
    b = mqtt_broker
    client_id = unique("admin")
    device = Paho(b.mqtt_port, client_id)
    device.connect()
    wait_until(lambda: any(r["client_properties"].get("client_id") == client_id
                           for r in http_call(b, "GET", "/api/connections")[1]), what="the device listed")
    done = subprocess.run([RABBITMQADMIN, "-H", b.host, "-P", str(b.http_port), "-u", "guest", "-p", "guest",
                           "-f", "raw_json", "list", "connections", "name", "protocol", "user", "client_properties"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    mine = [r for r in json.loads(done.stdout) if r["client_properties"].get("client_id") == client_id]
    assert len(mine) == 1 and mine[0]["protocol"] == "MQTT 3.1.1" and mine[0]["user"] == "guest"
    device.disconnect()


def test_mqtt_listener_in_the_overview_and_its_health_check(mqtt_broker: MQTTBroker) -> None:
    listeners = http_call(mqtt_broker, "GET", "/api/overview")[1]["listeners"]
    assert {"protocol": "mqtt", "port": mqtt_broker.mqtt_port} in [
        {"protocol": entry["protocol"], "port": entry["port"]} for entry in listeners]
    status, body, _ = http_call(mqtt_broker, "GET", "/api/health/checks/protocol-listener/mqtt")
    assert (status, body["status"]) == (200, "ok"), body
