"""Limits, operator policies and global parameters move between a real RabbitMQ node and lavinpy, both
ways, and RabbitMQ's limits are enforced by lavinpy with RabbitMQ's texts."""

from __future__ import annotations

from typing import Any

import pika
import pika.exceptions
import pytest

from .conftest import http_call
from .rabbitmq_node import RabbitNode
from .test_rabbitmq_interop import FULL
from .test_rabbitmq_interop import pytestmark as pytestmark  # noqa: F401 - slow, needs rabbitmq-server


def _ok(broker: Any, method: str, path: str, body: Any = None) -> None:
    status, reply, _ = http_call(broker, method, path, body)
    assert status in (200, 201, 204), (method, path, status, reply)


def test_limits_round_trip_with_rabbitmq(rabbit: RabbitNode, fresh_broker: Any) -> None:
    _ok(rabbit, "PUT", "/api/vhosts/lv")
    _ok(rabbit, "PUT", "/api/users/carol", {"password": "carol-pw", "tags": ""})
    _ok(rabbit, "PUT", "/api/permissions/lv/carol", FULL)
    _ok(rabbit, "PUT", "/api/vhost-limits/lv/max-queues", {"value": 2})
    _ok(rabbit, "PUT", "/api/vhost-limits/lv/max-connections", {"value": 5})
    _ok(rabbit, "PUT", "/api/user-limits/carol/max-connections", {"value": 1})
    _ok(rabbit, "PUT", "/api/operator-policies/lv/cap", {"pattern": ".*", "apply-to": "queues", "priority": 0,
                                                         "definition": {"max-length": 5, "message-ttl": 3600000}})
    _ok(rabbit, "PUT", "/api/global-parameters/cluster_name", {"name": "cluster_name", "value": "from-rabbit"})
    _ok(rabbit, "PUT", "/api/queues/lv/first", {"durable": True})
    exported = http_call(rabbit, "GET", "/api/definitions")[1]

    _ok(fresh_broker, "POST", "/api/definitions", exported)
    assert http_call(fresh_broker, "GET", "/api/vhost-limits/lv")[1] == [
        {"vhost": "lv", "value": {"max-queues": 2, "max-connections": 5}}]
    assert http_call(fresh_broker, "GET", "/api/user-limits/carol")[1] == [
        {"user": "carol", "value": {"max-connections": 1}}]
    assert [p["name"] for p in http_call(fresh_broker, "GET", "/api/operator-policies/lv")[1]] == ["cap"]
    assert http_call(fresh_broker, "GET", "/api/overview")[1]["cluster_name"] == "from-rabbit"
    queue = http_call(fresh_broker, "GET", "/api/queues/lv/first")[1]
    assert queue["operator_policy"] == "cap"
    assert queue["effective_policy_definition"] == {"max-length": 5, "message-ttl": 3600000}

    conn = pika.BlockingConnection(pika.URLParameters(fresh_broker.url_for("carol", "carol-pw", "lv")))
    with pytest.raises(pika.exceptions.AMQPConnectionError) as refused:
        pika.BlockingConnection(pika.URLParameters(fresh_broker.url_for("carol", "carol-pw", "lv")))
    assert "user connection limit (1) is reached" in str(refused.value)
    ch = conn.channel()
    ch.queue_declare("second", durable=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
        ch.queue_declare("third", durable=True)
    assert caught.value.reply_text == ("PRECONDITION_FAILED - cannot declare queue 'third': "
                                       "queue limit in vhost 'lv' (2) is reached")
    conn.close()

    # lavinpy's export imports back into RabbitMQ: the limits and the operator policy with it
    back = http_call(fresh_broker, "GET", "/api/definitions")[1]
    _ok(rabbit, "DELETE", "/api/operator-policies/lv/cap")
    _ok(rabbit, "DELETE", "/api/vhost-limits/lv/max-queues")
    _ok(rabbit, "POST", "/api/definitions", back)
    assert http_call(rabbit, "GET", "/api/vhost-limits/lv")[1][0]["value"]["max-queues"] == 2
    assert [p["name"] for p in http_call(rabbit, "GET", "/api/operator-policies/lv")[1]] == ["cap"]
