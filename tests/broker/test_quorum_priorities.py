"""Quorum-queue priorities as RabbitMQ 4.3's: always on without an argument, strict levels 0-31, a
message without a priority counting as 4, one above 31 as 31, FIFO within a level; the order holds
across a restart, and the quorum rules (x-max-priority refused, delivery limit) stay."""

from __future__ import annotations

import pytest

from lavinpy.wire.errors import AMQPChannelError
from tests.broker.model_harness import Model

PUBLISHED = [("a", None), ("b", 0), ("c", 5), ("d", 31), ("e", 200), ("f", 4), ("g", None), ("h", 3)]
SERVED = ["d", "e", "c", "a", "f", "g", "h", "b"]


@pytest.fixture
def model(tmp_path):
    m = Model(tmp_path)
    yield m
    m.close()


def _publish(model: Model, queue: str) -> None:
    for body, priority in PUBLISHED:
        properties = {"delivery_mode": 2} if priority is None else {"delivery_mode": 2, "priority": priority}
        assert model.publish(queue, body.encode(), **properties)


def test_strict_levels_with_4_for_no_priority(model):
    model.declare("qq", durable=True, queue_type="quorum")
    _publish(model, "qq")
    assert model.bodies("qq") == SERVED


def test_the_order_holds_across_a_restart(model):
    model.declare("qq", durable=True, queue_type="quorum")
    _publish(model, "qq")
    model.reopen()
    assert model.bodies("qq") == SERVED


def test_a_requeued_message_goes_back_to_its_level(model):
    model.declare("qq", durable=True, queue_type="quorum")
    _publish(model, "qq")
    [first] = model.get("qq", ackmode="reject_requeue_true")
    assert first["payload"] == "d"
    assert model.bodies("qq")[:2] == ["d", "e"]


def test_a_classic_queue_stays_fifo_and_quorum_refuses_x_max_priority(model):
    model.declare("classic", durable=True)
    _publish(model, "classic")
    assert model.bodies("classic") == [body for body, _ in PUBLISHED]
    with pytest.raises(AMQPChannelError, match="x-max-priority"):
        model.declare("qq2", durable=True, queue_type="quorum", max_priority=10)
