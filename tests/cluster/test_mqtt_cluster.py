"""MQTT in a cluster: a follower forwards its MQTT port to the leader's with a PROXY line (the leader
shows the client's own address), and retained messages are replicated with the store's files, so a
follower promoted after a kill -9 of the leader still delivers them."""

from __future__ import annotations

import json
import socket

import pytest

from tests.helpers import wait_until
from tests.mqtt.conftest import Paho, read_until_closed

from .harness import PREFIX, Cluster
from .test_proxying import http_get


def _isr(cluster: Cluster) -> list[str]:
    value = cluster.etcd.get(f"{PREFIX}/isr")
    return json.loads(value[0]) if value else []


@pytest.fixture
def two(cluster: Cluster):
    nodes = cluster.start(2)
    leader = cluster.wait_for_leader(30)
    follower = next(n for n in nodes if n is not leader)
    wait_until(lambda: f"following leader {leader.node_id}" in follower.log_text(), 15, what="the follower to follow")
    wait_until(lambda: set(_isr(cluster)) == {n.node_id for n in nodes}, 30, what="both nodes in the ISR")
    return leader, follower


def test_a_publish_through_a_follower_reaches_a_subscriber_on_the_leader(two) -> None:
    leader, follower = two
    subscriber = Paho(leader.mqtt_port, "on-leader")
    publisher = Paho(follower.mqtt_port, "through-follower")
    try:
        assert subscriber.connect()[1] == 0 and publisher.connect()[1] == 0
        assert subscriber.subscribe("cluster/+/temp", 1) == [1]
        publisher.publish("cluster/kitchen/temp", b"21.5", qos=1)  # PUBACKed through the follower
        message = subscriber.message()
        assert (message.topic, message.payload, message.qos) == ("cluster/kitchen/temp", b"21.5", 1)

        client_port = publisher.client.socket().getsockname()[1]
        status, connections = http_get(leader.http_port, "/api/connections")
        assert status == 200
        mine = [c for c in connections if c["peer_port"] == client_port]
        assert len(mine) == 1, connections
        assert mine[0]["protocol"] == "MQTT 3.1.1"
        assert mine[0]["peer_host"] == "127.0.0.1"
        assert mine[0]["port"] == follower.mqtt_port  # the address the client connected to
        assert mine[0]["name"] == f"127.0.0.1:{client_port} -> 127.0.0.1:{follower.mqtt_port}"
    finally:
        publisher.disconnect()
        subscriber.disconnect()


def test_a_follower_without_a_leader_answers_server_unavailable(cluster: Cluster) -> None:
    cluster.etcd.etcdctl("put", f"{PREFIX}/isr", '["another-node"]')  # an ISR this node is not in: no leader
    (node,) = cluster.start(1)
    wait_until(lambda: "forwarding MQTT" in node.log_text(), 15, 0.1, "the node's MQTT port")
    # The answer comes without waiting for the CONNECT (a CONNECT arriving after the close would
    # reset the connection under the answer): read before sending.
    with socket.create_connection(("127.0.0.1", node.mqtt_port), timeout=10) as client:
        assert read_until_closed(client) == b"\x20\x02\x00\x03"  # CONNACK: server unavailable, then closed
    assert "MQTT connection from 127.0.0.1" in node.log_text() and "no cluster leader is known" in node.log_text()


def test_a_retained_message_survives_a_kill_9_of_the_leader(cluster: Cluster, two) -> None:
    leader, follower = two
    publisher = Paho(leader.mqtt_port, "retainer")
    try:
        assert publisher.connect()[1] == 0
        for i in range(3):  # the last one of a topic counts; a cleared topic stays cleared
            publisher.publish("house/lamp", f"on-{i}".encode(), qos=1, retain=True)
        publisher.publish("house/door", b"open", qos=1, retain=True)
        publisher.publish("house/door", b"", qos=1, retain=True)  # PUBACKed: on the in-sync follower too
    finally:
        publisher.disconnect()
    leader.kill()
    promoted = cluster.wait_for_leader(60, exclude=leader)
    assert promoted is follower
    subscriber = Paho(follower.mqtt_port, "after-failover")
    try:
        assert subscriber.connect()[1] == 0
        assert subscriber.subscribe("house/#", 1) == [1]
        message = subscriber.message()
        assert (message.topic, message.payload, message.retain) == ("house/lamp", b"on-2", True)
        subscriber.no_message(1.0)
    finally:
        subscriber.disconnect()
