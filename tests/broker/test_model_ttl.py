"""Message TTL and queue expiry in the model, in process: x-message-ttl, the expiration property (the
smaller wins), expiry at the head by one timer, expired messages never handed out, dead-lettering of
expired messages, x-expires, and expiry counted from the original publish across a restart.

The model reads the wall clock itself, so the TTLs here are short and every wait only has a lower
bound (a slow machine waits longer, never fails)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from lavinpy.broker.errors import NOT_FOUND, PRECONDITION_FAILED, BrokerChannelError
from tests.broker.model_harness import Model, death, run, until


def test_the_head_expires_by_its_timer_and_the_smaller_ttl_wins(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.declare("q", message_ttl=100)
        m.publish("q", b"long", expiration="60000")  # the queue's 100 ms is smaller
        await until(lambda: m.count("q") == 0, what="the queue TTL to expire the head")
        m.declare("p", message_ttl=60000)
        m.publish("p", b"short", expiration="50")  # the message's 50 ms is smaller
        m.publish("p", b"stays")
        await until(lambda: m.count("p") == 1, what="the expiration to remove the head")
        assert m.bodies("p") == ["stays"]
    run(body, tmp_path)


def test_expired_messages_behind_the_head_are_never_handed_out(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.declare("q")
        m.publish("q", b"first")
        m.publish("q", b"dies", expiration="50")
        m.publish("q", b"lives")
        await asyncio.sleep(0.15)
        # Only the head has a timer: "dies" is checked when it reaches the head, and dropped then.
        assert m.bodies("q") == ["first", "lives"]
        assert m.count("q") == 0
    run(body, tmp_path)


def test_expiration_zero_without_a_consumer_expires_at_once(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.declare("q")
        m.publish("q", b"now", expiration="0")
        await until(lambda: m.count("q") == 0, what="expiration 0 to drop the message")
        assert m.get("q") == []
    run(body, tmp_path)


def test_an_expired_message_is_dead_lettered_with_its_original_expiration(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.declare("dlq")
        m.declare("q", dead_letter_exchange="", dead_letter_routing_key="dlq")
        m.publish("q", b"x", expiration="50", headers={"h": 1})
        await until(lambda: m.count("dlq") == 1, what="the expired message in the dead-letter queue")
        [got] = m.get("dlq")
        assert got["payload"] == "x" and got["routing_key"] == "dlq" and got["exchange"] == ""
        props = got["properties"]
        assert "expiration" not in props and props["headers"]["h"] == 1
        [entry] = death(got)
        assert (entry["reason"], entry["queue"], entry["count"]) == ("expired", "q", 1)
        assert entry["original-expiration"] == "50" and entry["routing-keys"] == ["q"]
        assert props["headers"]["x-first-death-reason"] == "expired"
        assert m.count("q") == 0
    run(body, tmp_path)


def test_x_expires_deletes_an_unused_queue_even_with_messages(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.declare("q", expires=100)
        m.publish("q", b"x")

        def gone() -> bool:
            try:
                m.vhost.get_queue("q")
            except BrokerChannelError as e:
                assert e.kind is NOT_FOUND
                return True
            return False
        await until(gone, what="x-expires to delete the queue")
        m.declare("kept", expires=60000)
        assert m.count("kept") == 0
    run(body, tmp_path)


def test_expiry_counts_from_the_original_publish_across_a_restart(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.declare("q", durable=True, message_ttl=60000)
        m.publish("q", b"short", delivery_mode=2, expiration="200")
        m.publish("q", b"kept", delivery_mode=2)
        m.reopen()
        await asyncio.sleep(0.3)  # past the 200 ms since the publish, whatever the restart took
        assert m.bodies("q") == ["kept"]
    run(body, tmp_path)


@pytest.mark.parametrize("arguments, name", [({"message_ttl": -1}, "x-message-ttl"),
                                             ({"message_ttl": "1000"}, "x-message-ttl"),
                                             ({"expires": 0}, "x-expires")])
def test_bad_ttl_arguments_are_refused_with_406(tmp_path: Path, arguments: dict, name: str) -> None:
    async def body(m: Model) -> None:
        with pytest.raises(BrokerChannelError) as refused:
            m.declare("q", **arguments)
        assert refused.value.kind is PRECONDITION_FAILED and f"'{name}'" in refused.value.text
    run(body, tmp_path)
