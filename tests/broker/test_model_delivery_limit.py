"""x-delivery-limit in the model, in process: each return of a message to its queue counts (shown as
x-delivery-count on the next delivery); one return past the limit dead-letters it with reason
delivery_limit (or drops it without a dead-letter exchange); -1 is no limit; the count survives a
restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from lavinpy.broker.errors import PRECONDITION_FAILED, BrokerChannelError
from tests.broker.model_harness import Model, death, run


def delivery_count(message: dict) -> int | None:
    return message["properties"].get("headers", {}).get("x-delivery-count")


def test_the_limit_dead_letters_after_limit_plus_one_attempts(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.dead_letter_target()
        m.declare("q", delivery_limit=2, dead_letter_exchange="dlx")
        m.publish("q", b"job")
        counts = []
        for _ in range(3):
            [got] = m.get("q", ackmode="reject_requeue_true")
            counts.append(delivery_count(got))
        assert counts == [None, 1, 2]
        assert m.count("q") == 0
        [dead] = m.get("dead")
        assert dead["payload"] == "job"
        assert [(e["reason"], e["queue"]) for e in death(dead)] == [("delivery_limit", "q")]
    run(body, tmp_path)


def test_limit_zero_dead_letters_at_the_first_return(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.dead_letter_target()
        m.declare("q", delivery_limit=0, dead_letter_exchange="dlx")
        m.publish("q", b"x")
        m.get("q", ackmode="reject_requeue_true")
        assert (m.count("q"), m.count("dead")) == (0, 1)
    run(body, tmp_path)


def test_without_a_dead_letter_exchange_the_message_is_dropped(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.declare("q", delivery_limit=1)
        m.publish("q", b"x")
        m.publish("q", b"y")
        for _ in range(2):
            m.get("q", ackmode="reject_requeue_true")  # x is returned twice: over the limit
        assert m.bodies("q") == ["y"]
    run(body, tmp_path)


def test_a_settled_message_does_not_count(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.declare("q", delivery_limit=0)
        m.publish("q", b"acked")
        m.publish("q", b"next")
        [got] = m.get("q", ackmode="ack_requeue_false")
        assert got["payload"] == "acked" and delivery_count(got) is None
        [got] = m.get("q")
        assert got["payload"] == "next" and delivery_count(got) is None
    run(body, tmp_path)


def test_the_delivery_count_survives_a_restart(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.declare("q", durable=True, delivery_limit=5)
        m.publish("q", b"job", delivery_mode=2)
        m.get("q", ackmode="reject_requeue_true")
        m.get("q", ackmode="reject_requeue_true")
        m.reopen()
        [got] = m.get("q", ackmode="reject_requeue_true")
        assert got["payload"] == "job" and got["redelivered"] and delivery_count(got) == 2
    run(body, tmp_path)


def test_limit_minus_one_means_no_limit(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.declare("q", delivery_limit=-1)
        m.publish("q", b"x")
        for _ in range(5):
            m.get("q", ackmode="reject_requeue_true")
        [got] = m.get("q")
        assert got["payload"] == "x" and got["redelivered"]
    run(body, tmp_path)


@pytest.mark.parametrize("value", [-2, "3"])
def test_a_bad_delivery_limit_is_refused_with_406(tmp_path: Path, value: object) -> None:
    async def body(m: Model) -> None:
        with pytest.raises(BrokerChannelError) as refused:
            m.declare("q", delivery_limit=value)
        assert refused.value.kind is PRECONDITION_FAILED
    run(body, tmp_path)
