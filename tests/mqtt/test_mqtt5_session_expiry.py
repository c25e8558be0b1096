"""MQTT 5 Session Expiry Interval with paho-mqtt: a session resumed within its interval is present; one
resumed after it is not (3.1.2.11.2), whatever of its state the broker still held when it expired
(its QoS 2 grants, which outlive the queues' x-expires), so the client knows to subscribe again."""

from __future__ import annotations

import time

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
