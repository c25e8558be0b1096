"""MQTT in a cluster: a follower forwards its MQTT port to the leader's with a PROXY line (the leader
shows the client's own address), and retained messages and QoS 2 session state are replicated with the
store's files, so a follower promoted after a kill -9 of the leader still delivers and honours them."""

from __future__ import annotations

import json
import socket

import pytest

from lavinpy.mqtt import codec
from tests.helpers import wait_until
from tests.mqtt.conftest import Paho, read_until_closed
from tests.mqtt.test_mqtt_qos2 import Strict, parsed, reply, subscribe

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


def test_qos2_in_flight_state_survives_a_kill_9_of_the_leader(cluster: Cluster, two) -> None:
    """The QoS 2 state of persistent sessions is replicated with the store's files: after a failover
    the publisher's id still awaits its PUBREL (a PUBLISH again is a duplicate), the subscriber's PUBREL
    owed comes again, and its PUBLISH awaiting PUBREC comes again with its id."""
    leader, follower = two
    subscriber = Strict(leader.mqtt_port, "q2-sub", clean=False)
    subscriber.send(subscribe(1, "q2/#", 2))
    assert subscriber.packet() == (codec.SUBACK, 0, b"\x00\x01\x02")
    publisher = Strict(leader.mqtt_port, "q2-pub", clean=False)
    publisher.send(codec.publish("q2/a", b"one", 2, False, False, 11))
    assert publisher.packet() == parsed(codec.PUBREC, 11)  # durable on the in-sync follower too
    publisher.send(codec.publish("q2/a", b"two", 2, False, False, 12))
    assert publisher.packet() == parsed(codec.PUBREC, 12)
    one, two_ = subscriber.publish(), subscriber.publish()
    subscriber.send(reply(codec.PUBREC, one.packet_id))
    assert subscriber.packet() == parsed(codec.PUBREL, one.packet_id)
    leader.kill()
    subscriber.close()
    publisher.close()
    promoted = cluster.wait_for_leader(60, exclude=leader)
    assert promoted is follower
    publisher = Strict(follower.mqtt_port, "q2-pub", clean=False, present=True)
    publisher.send(codec.publish("q2/a", b"one", 2, False, True, 11))
    assert publisher.packet() == parsed(codec.PUBREC, 11)
    publisher.send(reply(codec.PUBREL, 11), reply(codec.PUBREL, 12))
    assert [publisher.packet(), publisher.packet()] == [parsed(codec.PUBCOMP, 11), parsed(codec.PUBCOMP, 12)]
    publisher.close()
    subscriber = Strict(follower.mqtt_port, "q2-sub", clean=False, present=True)
    assert subscriber.packet() == parsed(codec.PUBREL, one.packet_id)
    again = subscriber.publish()
    assert (again.payload, again.qos, again.dup, again.packet_id) == (b"two", 2, True, two_.packet_id)
    subscriber.send(reply(codec.PUBCOMP, one.packet_id), reply(codec.PUBREC, two_.packet_id))
    assert subscriber.packet() == parsed(codec.PUBREL, two_.packet_id)
    subscriber.send(reply(codec.PUBCOMP, two_.packet_id))
    subscriber.nothing(1.0)
    subscriber.close()
