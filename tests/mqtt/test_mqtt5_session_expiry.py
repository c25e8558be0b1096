"""MQTT 5 Session Expiry Interval with paho-mqtt: a session resumed within its interval is present; one
resumed after it is not (3.1.2.11.2), whatever of its state the broker still held when it expired
(its QoS 2 grants, which outlive the queues' x-expires), so the client knows to subscribe again."""

from __future__ import annotations

import time
from typing import Any

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.e2e.conftest import http_call
from tests.helpers import wait_until

from .conftest import MQTTBroker, unique
from .test_mqtt5_paho import Paho5


def _resume(b: MQTTBroker, client_id: str, expiry: int) -> bool:
    client = Paho5(b.mqtt_port, client_id)
    flags, rc, _props = client.connect(clean_start=False, SessionExpiryInterval=expiry)
    assert rc == 0
    client.close()
    return bool(flags.session_present)


def test_a_session_with_qos2_grants_is_present_within_its_expiry_and_gone_after(mqtt_broker: MQTTBroker) -> None:
    client_id = unique("exp")
    first = Paho5(mqtt_broker.mqtt_port, client_id)
    first.connect(SessionExpiryInterval=2)
    assert first.subscribe("exp/qos2", qos=2) == [2]
    assert first.subscribe("exp/qos1", qos=1) == [1]
    first.close()
    assert _resume(mqtt_broker, client_id, 2)  # within 2 s: present (and its interval starts again)
    time.sleep(3)
    assert not _resume(mqtt_broker, client_id, 2)  # 3 s after the last connection: expired
    again = Paho5(mqtt_broker.mqtt_port, client_id)
    again.connect(clean_start=False, SessionExpiryInterval=2)
    publisher = Paho5(mqtt_broker.mqtt_port, unique("pub"))
    publisher.connect()
    publisher.publish("exp/qos2", b"after expiry", qos=2)
    again.no_message(0.5)  # its subscriptions went with the session
    assert again.subscribe("exp/qos2", qos=2) == [2]
    publisher.publish("exp/qos2", b"subscribed again", qos=2)
    assert again.message().payload == b"subscribed again"
    again.close()
    publisher.close()


def test_ended_sessions_that_never_come_back_cost_no_memory() -> None:
    """Client ids that end sessions and never return are pruned once expired, as the table doubles."""
    from lavinpy.mqtt.state5 import VHostState

    state = VHostState()
    for i in range(5000):
        state.session_ended(f"gone-{i}", 0)  # expired at once
    state.session_ended("kept", 3600)
    assert len(state.expires_at) <= 1025 and "kept" in state.expires_at
    assert not state.session_expired("kept") and "kept" not in state.expires_at  # resumed: forgotten
    state.session_ended("back", 0)
    assert state.session_expired("back")  # its interval (0 s) has passed
    assert not state.session_expired("never-ended")


def _queue_expires(b: MQTTBroker, client_id: str) -> Any:
    status, queue, _headers = http_call(b, "GET", f"/api/queues/%2F/mqtt-subscription-{client_id}qos1")
    return queue["arguments"].get("x-expires") if status == 200 else "gone"


def _disconnect(client: Paho5, expiry: int) -> None:
    """DISCONNECT with a Session Expiry Interval."""
    props = Properties(PacketTypes.DISCONNECT)
    props.SessionExpiryInterval = expiry
    client.client.disconnect(properties=props)
    client.client.loop_stop()


def test_a_disconnect_or_a_resume_changes_the_queues_expiry(fresh_mqtt_broker: MQTTBroker) -> None:
    """The interval a DISCONNECT or a resumed session's CONNECT gives is the session queues' x-expires
    from then on (RabbitMQ rewrites it the same way), also across a restart; a DISCONNECT with 0 ends
    the session at once."""
    b = fresh_mqtt_broker
    client_id = unique("raise")
    client = Paho5(b.mqtt_port, client_id)
    client.connect(SessionExpiryInterval=1)
    assert client.subscribe("raise/t", qos=1) == [1]
    assert _queue_expires(b, client_id) == 1000
    _disconnect(client, 4)  # raised from 1 s to 4 s
    assert _queue_expires(b, client_id) == 4000
    time.sleep(2)  # past the CONNECT's interval, within the DISCONNECT's
    assert _queue_expires(b, client_id) == 4000
    resumed = Paho5(b.mqtt_port, client_id)
    flags, rc, _props = resumed.connect(clean_start=False, SessionExpiryInterval=30)
    assert rc == 0 and flags.session_present
    assert _queue_expires(b, client_id) == 30_000  # a resumed session's queue takes the new interval
    resumed.close()
    b.restart()
    assert _queue_expires(b, client_id) == 30_000, "the rewritten definition is the one replayed"
    again = Paho5(b.mqtt_port, client_id)
    flags, rc, _props = again.connect(clean_start=False, SessionExpiryInterval=30)
    assert rc == 0 and flags.session_present
    _disconnect(again, 0)  # lowered to 0: the session ends with this connection
    wait_until(lambda: _queue_expires(b, client_id) == "gone", timeout=5)
    assert not _resume(b, client_id, 30)
