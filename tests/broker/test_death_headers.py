"""x-death history, the cycle rule and x-delivery-count on real property bytes, decoded with pamqp."""

from __future__ import annotations

import datetime

import pytest
from pamqp import commands

from lavinpy.broker.queues.death_headers import (
    dead_letter_properties,
    death_routing_keys,
    delivery_count_properties,
    header_items,
    should_drop_cycle,
)
from lavinpy.wire.properties import decode_properties, encode_properties

T0 = 1_700_000_000_123  # ms


def props(**fields) -> bytes:
    return encode_properties(commands.Basic.Properties(**fields))


def headers_of(raw: bytes) -> dict:
    return decode_properties(raw).headers or {}


def die(raw: bytes, queue: str, reason: str, now_ms: int = T0, exchange: str = "ex",
        keys: list[str] | None = None, **kw) -> bytes:
    return dead_letter_properties(raw, queue=queue, reason=reason, exchange=exchange,
                                  routing_keys=keys or ["rk"], now_ms=now_ms, **kw)


def test_first_death_builds_rabbitmq_headers() -> None:
    raw = props(content_type="text/plain", delivery_mode=2, expiration="60000", headers={"app": "x"})
    out = decode_properties(die(raw, "work", "expired", keys=["rk", "cc1"]))
    assert out.content_type == "text/plain" and out.delivery_mode == 2
    assert out.expiration is None  # removed from the copy...
    h = out.headers
    assert h["app"] == "x"
    assert h["x-death"] == [{
        "count": 1, "reason": "expired", "queue": "work",
        "time": datetime.datetime.fromtimestamp(T0 // 1000, datetime.UTC),
        "exchange": "ex", "routing-keys": ["rk", "cc1"],
        "original-expiration": "60000",  # ...and kept here
    }]
    assert (h["x-first-death-reason"], h["x-first-death-queue"], h["x-first-death-exchange"]) == (
        "expired", "work", "ex")
    assert (h["x-last-death-reason"], h["x-last-death-queue"], h["x-last-death-exchange"]) == (
        "expired", "work", "ex")


def test_wire_types_are_rabbitmqs() -> None:
    raw = die(props(), "q", "rejected")
    items = dict(header_items(raw))
    entry = items["x-death"]
    assert entry[:1] == b"A"
    assert b"\x05countl\x00\x00\x00\x00\x00\x00\x00\x01" in entry  # count is a long (64-bit)
    assert b"\x04timeT" in entry  # time is a timestamp
    assert items["x-first-death-queue"] == b"S\x00\x00\x00\x01q"


def test_same_queue_and_reason_merge_and_move_to_front() -> None:
    raw = die(props(), "a", "expired", now_ms=T0)
    raw = die(raw, "b", "rejected", now_ms=T0 + 5000, exchange="dlx")
    raw = die(raw, "a", "expired", now_ms=T0 + 9000, exchange="dlx2")
    h = headers_of(raw)
    deaths = h["x-death"]
    assert [(d["queue"], d["reason"], d["count"]) for d in deaths] == [("a", "expired", 2), ("b", "rejected", 1)]
    # the merged entry keeps its first time and exchange, as RabbitMQ does
    assert deaths[0]["time"] == datetime.datetime.fromtimestamp(T0 // 1000, datetime.UTC)
    assert deaths[0]["exchange"] == "ex"
    assert (h["x-first-death-queue"], h["x-first-death-reason"]) == ("a", "expired")
    assert (h["x-last-death-queue"], h["x-last-death-reason"], h["x-last-death-exchange"]) == (
        "a", "expired", "dlx2")


def test_same_queue_other_reason_is_a_new_entry() -> None:
    raw = die(die(props(), "a", "expired"), "a", "maxlen")
    assert [(d["reason"], d["count"]) for d in headers_of(raw)["x-death"]] == [("maxlen", 1), ("expired", 1)]


def test_untouched_headers_keep_their_exact_bytes() -> None:
    # A publisher's 8-byte long 5 would come back as a 1-byte int if the table were re-encoded by pamqp.
    custom = b"\x05retryl\x00\x00\x00\x00\x00\x00\x00\x05"
    table = len(custom).to_bytes(4, "big") + custom
    raw = (0x2000).to_bytes(2, "big") + table
    assert header_items(raw) == [("retry", b"l\x00\x00\x00\x00\x00\x00\x00\x05")]
    out = die(raw, "q", "rejected")
    assert dict(header_items(out))["retry"] == b"l\x00\x00\x00\x00\x00\x00\x00\x05"


def test_other_properties_are_unchanged() -> None:
    raw = props(content_type="a", content_encoding="b", priority=7, correlation_id="c", reply_to="r",
                message_id="m", timestamp=datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC), app_id="app")
    before, after = decode_properties(raw), decode_properties(die(raw, "q", "maxlen"))
    for name in ("content_type", "content_encoding", "priority", "correlation_id", "reply_to", "message_id",
                 "timestamp", "app_id"):
        assert getattr(after, name) == getattr(before, name)


def test_drop_cc_when_a_dead_letter_routing_key_is_set() -> None:
    raw = props(headers={"CC": ["a", "b"], "keep": 1})
    assert death_routing_keys("rk", raw) == ["rk", "a", "b"]
    assert "CC" in headers_of(die(raw, "q", "rejected"))
    h = headers_of(die(raw, "q", "rejected", drop_cc=True))
    assert "CC" not in h and h["keep"] == 1
    assert death_routing_keys("rk", props()) == ["rk"]


def test_automatic_cycle_is_dropped() -> None:
    # q1 expires into q2, which expires back into q1: fully automatic, so RabbitMQ drops it.
    raw = die(props(), "q1", "expired")
    assert should_drop_cycle(raw, "q1") is True
    assert should_drop_cycle(raw, "q2") is False
    raw = die(raw, "q2", "expired")
    assert should_drop_cycle(raw, "q1") is True


def test_rejection_in_the_cycle_lets_it_through() -> None:
    # retry pattern: work --rejected--> retry (ttl) --expired--> work
    raw = die(props(), "work", "rejected")
    assert should_drop_cycle(raw, "retry") is False
    raw = die(raw, "retry", "expired")
    assert should_drop_cycle(raw, "work") is False
    # consumed again from work and rejected again: count grows, still not a cycle
    raw = die(raw, "work", "rejected")
    assert should_drop_cycle(raw, "retry") is False
    assert [(d["queue"], d["count"]) for d in headers_of(raw)["x-death"]] == [("work", 2), ("retry", 1)]


def test_rejected_at_the_target_itself_is_not_a_cycle() -> None:
    raw = die(props(), "q", "rejected")
    assert should_drop_cycle(raw, "q") is False


@pytest.mark.parametrize("reason", ["expired", "maxlen", "delivery_limit"])
def test_delivery_limit_and_maxlen_cycles_drop_too(reason: str) -> None:
    assert should_drop_cycle(die(props(), "q", reason), "q") is True


def test_client_made_history_is_not_an_automatic_cycle() -> None:
    raw = props(headers={"x-death": ["not a table", {"queue": "q", "reason": "expired"}]})
    assert should_drop_cycle(raw, "q") is False
    assert should_drop_cycle(props(), "q") is False


def test_delivery_count_header() -> None:
    raw = props(delivery_mode=2, headers={"a": "b"})
    out = delivery_count_properties(raw, 3)
    assert headers_of(out) == {"a": "b", "x-delivery-count": 3}
    out = delivery_count_properties(out, 4)
    assert headers_of(out)["x-delivery-count"] == 4
    assert dict(header_items(out))["x-delivery-count"] == b"l" + (4).to_bytes(8, "big")
    assert headers_of(delivery_count_properties(props(), 1)) == {"x-delivery-count": 1}
    assert decode_properties(out).delivery_mode == 2
