"""MQTT connections in the management API: listed with protocol "MQTT 3.1.1" (or 3.1), counted in the
overview, shown by name, closed by DELETE (the will goes out: the client did not ask to end)."""

from __future__ import annotations

import urllib.parse

import paho.mqtt.client as mqtt

from tests.e2e.conftest import http_call
from tests.helpers import wait_until

from .conftest import MQTTBroker, Paho, unique


def _mine(broker: MQTTBroker, client_id: str) -> list[dict]:
    rows = http_call(broker, "GET", "/api/connections")[1]
    return [r for r in rows if r.get("client_properties", {}).get("client_id") == client_id]


def test_listed_shown_and_closed_through_the_api(mqtt_broker: MQTTBroker) -> None:
    client_id, old_id = unique("api"), unique("api31")
    client = Paho(mqtt_broker.mqtt_port, client_id, keepalive=30)
    client.client.will_set(f"{client_id}/status", b"offline", 1)
    client.connect()
    old = Paho(mqtt_broker.mqtt_port, old_id, protocol=mqtt.MQTTv31)
    old.connect()
    watcher = Paho(mqtt_broker.mqtt_port, unique("w"))
    watcher.connect()
    watcher.subscribe(f"{client_id}/#", 1)
    row = wait_until(lambda: _mine(mqtt_broker, client_id), what="the MQTT connection listed")[0]
    assert (row["protocol"], row["user"], row["vhost"], row["timeout"]) == ("MQTT 3.1.1", "guest", "/", 30)
    assert row["peer_host"] == "127.0.0.1" and row["port"] == mqtt_broker.mqtt_port
    assert _mine(mqtt_broker, old_id)[0]["protocol"] == "MQTT 3.1"
    overview = http_call(mqtt_broker, "GET", "/api/overview")[1]
    assert overview["object_totals"]["connections"] >= 3
    path = "/api/connections/" + urllib.parse.quote(row["name"], safe="")
    status, shown, _ = http_call(mqtt_broker, "GET", path)
    assert status == 200 and shown["name"] == row["name"]
    assert http_call(mqtt_broker, "DELETE", path)[0] == 204
    client.disconnects.get(timeout=10)
    client.client.loop_stop()
    assert watcher.message().payload == b"offline"
    wait_until(lambda: not _mine(mqtt_broker, client_id), what="the connection gone from the list")
    assert http_call(mqtt_broker, "GET", path)[0] == 404
    old.disconnect()
    watcher.disconnect()


def test_one_connection_shows_its_mqtt_session_and_no_channels(mqtt_broker: MQTTBroker) -> None:
    client_id = unique("session")
    client = Paho(mqtt_broker.mqtt_port, client_id, clean_session=False)
    client.connect()
    client.subscribe(f"{client_id}/+/temp", 1)
    client.subscribe(f"{client_id}/#", 0)
    client.subscribe(f"{client_id}/exact", 2)
    row = wait_until(lambda: _mine(mqtt_broker, client_id), what="the MQTT connection listed")[0]
    path = "/api/connections/" + urllib.parse.quote(row["name"], safe="")
    shown = http_call(mqtt_broker, "GET", path)[1]
    assert shown["mqtt_session"] == {
        "client_id": client_id, "clean_session": False, "messages_unacknowledged": 0, "prefetch_count": 10,
        "pubrel_pending": 0,
        "subscriptions": [{"topic_filter": f"{client_id}/#", "qos": 0, "queue": f"mqtt-subscription-{client_id}qos0"},
                          {"topic_filter": f"{client_id}/+/temp", "qos": 1,
                           "queue": f"mqtt-subscription-{client_id}qos1"},
                          {"topic_filter": f"{client_id}/exact", "qos": 2,  # on the QoS 1 queue
                           "queue": f"mqtt-subscription-{client_id}qos1"}]}
    assert http_call(mqtt_broker, "GET", path + "/channels")[1] == []
    consumers = {c["queue"]["name"]: c for c in http_call(mqtt_broker, "GET", "/api/consumers/%2F")[1]
                 if c["channel_details"]["connection_name"] == row["name"]}
    assert sorted(consumers) == [f"mqtt-subscription-{client_id}qos0", f"mqtt-subscription-{client_id}qos1"]
    qos1 = consumers[f"mqtt-subscription-{client_id}qos1"]
    assert (qos1["ack_required"], qos1["prefetch_count"], qos1["channel_details"]["user"]) == (True, 10, "guest")
    assert consumers[f"mqtt-subscription-{client_id}qos0"]["ack_required"] is False
    client.client.unsubscribe(f"{client_id}/#")
    wait_until(lambda: len(http_call(mqtt_broker, "GET", path)[1]["mqtt_session"]["subscriptions"]) == 2,
               what="the unsubscribed filter gone")
    client.disconnect()
    for qos in (0, 1):  # the persistent session's queues, left by design
        http_call(mqtt_broker, "DELETE", f"/api/queues/%2F/mqtt-subscription-{client_id}qos{qos}")
