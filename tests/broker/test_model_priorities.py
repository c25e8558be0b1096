"""Priority queues in the model, in process: x-max-priority orders ready messages highest first and
FIFO within a level; a priority above the maximum counts as the maximum, none as 0; a requeued
message keeps its level; the order survives a restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from lavinpy.broker.errors import PRECONDITION_FAILED, BrokerChannelError
from tests.broker.model_harness import Model, run


def test_higher_priority_first_fifo_within_a_level(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.declare("q", max_priority=5)
        for name, priority in (("a1", 1), ("c3", 3), ("b1", 1), ("d3", 3), ("e5", 5), ("f0", 0)):
            m.publish("q", name.encode(), priority=priority)
        assert m.bodies("q") == ["e5", "c3", "d3", "a1", "b1", "f0"]
    run(body, tmp_path)


def test_no_priority_is_zero_and_above_the_maximum_is_the_maximum(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.declare("q", max_priority=2)
        m.publish("q", b"none")
        m.publish("q", b"two", priority=2)
        m.publish("q", b"nine", priority=9)  # counts as 2: FIFO after "two"
        m.publish("q", b"zero", priority=0)
        assert m.bodies("q") == ["two", "nine", "none", "zero"]
    run(body, tmp_path)


def test_a_queue_without_max_priority_ignores_priorities(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.declare("q")
        m.publish("q", b"low", priority=0)
        m.publish("q", b"high", priority=9)
        assert m.bodies("q") == ["low", "high"]
    run(body, tmp_path)


def test_a_requeued_message_keeps_its_level(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.declare("q", max_priority=5)
        m.publish("q", b"low", priority=1)
        m.publish("q", b"high", priority=4)
        [first] = m.get("q", ackmode="reject_requeue_true")
        assert first["payload"] == "high" and not first["redelivered"]
        m.publish("q", b"mid", priority=3)
        got = m.get("q", 3)
        assert [(g["payload"], g["redelivered"]) for g in got] == [("high", True), ("mid", False), ("low", False)]
    run(body, tmp_path)


def test_priority_order_survives_a_restart(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.declare("q", durable=True, max_priority=9)
        for name, priority in (("p1", 1), ("p9", 9), ("p5", 5), ("p9b", 9)):
            m.publish("q", name.encode(), delivery_mode=2, priority=priority)
        m.reopen()
        assert m.bodies("q") == ["p9", "p9b", "p5", "p1"]
    run(body, tmp_path)


@pytest.mark.parametrize("value", [-1, 256, "5"])
def test_a_bad_max_priority_is_refused_with_406(tmp_path: Path, value: object) -> None:
    async def body(m: Model) -> None:
        with pytest.raises(BrokerChannelError) as refused:
            m.declare("q", max_priority=value)
        assert refused.value.kind is PRECONDITION_FAILED and "'x-max-priority'" in refused.value.text
    run(body, tmp_path)
