"""Dead-lettering in the model, in process: which settlements dead-letter, where the copy goes (the
dead-letter exchange, the original or the configured routing key), RabbitMQ's x-death history
(reason, queue, exchange, routing keys, counts merged by queue and reason, x-first/last-death-*),
and cycles: a client-driven one is allowed, an automatic one is dropped."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.broker.model_harness import Model, death, run, until


def test_reject_without_requeue_dead_letters_with_reason_rejected(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.dead_letter_target()
        m.declare("q", dead_letter_exchange="dlx")
        m.publish("q", b"r", headers={"CC": ["cc-key"]})
        m.publish("q", b"requeued")
        m.get("q", ackmode="reject_requeue_false")
        m.get("q", ackmode="reject_requeue_true")  # back in the queue, not dead-lettered
        assert m.count("q") == 1 and m.count("dead") == 1
        [got] = m.get("dead")
        assert (got["payload"], got["exchange"], got["routing_key"]) == ("r", "dlx", "q")
        [entry] = death(got)
        assert (entry["reason"], entry["queue"], entry["exchange"], entry["count"]) == ("rejected", "q", "", 1)
        assert entry["routing-keys"] == ["q", "cc-key"] and "original-expiration" not in entry
        headers = got["properties"]["headers"]
        assert (headers["x-first-death-reason"], headers["x-first-death-queue"], headers["x-first-death-exchange"]) \
            == ("rejected", "q", "")
        assert (headers["x-last-death-reason"], headers["x-last-death-queue"]) == ("rejected", "q")
        assert m.bodies("q") == ["requeued"]
    run(body, tmp_path)


def test_an_acked_message_is_not_dead_lettered(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.dead_letter_target()
        m.declare("q", dead_letter_exchange="dlx")
        m.publish("q", b"done")
        m.get("q", ackmode="ack_requeue_false")
        assert m.count("q") == 0 and m.count("dead") == 0
    run(body, tmp_path)


def test_dead_letter_routing_key_replaces_the_original(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.declare("target")
        m.declare("q", dead_letter_exchange="", dead_letter_routing_key="target")
        m.publish("q", b"x")
        m.get("q", ackmode="reject_requeue_false")
        [got] = m.get("target")
        assert got["routing_key"] == "target" and death(got)[0]["routing-keys"] == ["q"]
    run(body, tmp_path)


def test_a_missing_dead_letter_exchange_drops_the_message(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.declare("q", dead_letter_exchange="nope")
        m.publish("q", b"x")
        m.get("q", ackmode="reject_requeue_false")
        assert m.count("q") == 0
    run(body, tmp_path)


def test_x_death_counts_merge_by_queue_and_reason(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.declare("a", dead_letter_exchange="", dead_letter_routing_key="b")
        m.declare("b", dead_letter_exchange="", dead_letter_routing_key="a")
        m.publish("a", b"ping")
        for source, target in (("a", "b"), ("b", "a"), ("a", "b")):  # rejected by a client each time
            m.get(source, ackmode="reject_requeue_false")
            assert m.count(target) == 1
        [got] = m.get("b")
        assert [(e["queue"], e["reason"], e["count"]) for e in death(got)] == [("a", "rejected", 2),
                                                                             ("b", "rejected", 1)]
        headers = got["properties"]["headers"]
        assert headers["x-first-death-queue"] == "a" and headers["x-last-death-queue"] == "a"
    run(body, tmp_path)


def test_an_automatic_cycle_is_dropped(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        # Expired back into the same queue with no client rejection in the cycle: dropped, not looping.
        m.declare("q", message_ttl=50, dead_letter_exchange="")
        m.publish("q", b"loop")
        await until(lambda: m.count("q") == 0, what="the expired message to leave")
        await asyncio.sleep(0.2)
        assert m.count("q") == 0
    run(body, tmp_path)


def test_the_dead_letter_copy_is_routed_like_a_publish(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.exchange("dlx", "direct")
        m.declare("by-key")
        m.declare("other")
        m.bind("by-key", "dlx", "q")
        m.bind("other", "dlx", "something-else")
        m.declare("q", dead_letter_exchange="dlx")
        m.publish("q", b"x")
        m.get("q", ackmode="reject_requeue_false")
        assert (m.count("by-key"), m.count("other")) == (1, 0)
    run(body, tmp_path)
