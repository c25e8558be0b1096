"""Queue length limits in the model, in process: x-max-length and x-max-length-bytes (body bytes of
ready messages), with drop-head (the oldest go, dead-lettered with reason maxlen), reject-publish (the
new message is refused and nothing is stored) and reject-publish-dlx (refused and dead-lettered)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lavinpy.broker.errors import PRECONDITION_FAILED, BrokerChannelError
from tests.broker.model_harness import Model, death, run


def test_drop_head_keeps_the_newest(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.declare("q", max_length=2)
        for i in range(4):
            assert m.publish("q", b"m%d" % i)
        assert m.count("q") == 2
        assert m.bodies("q") == ["m2", "m3"]
    run(body, tmp_path)


def test_drop_head_dead_letters_the_oldest_with_reason_maxlen(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.dead_letter_target()
        m.declare("q", max_length=1, dead_letter_exchange="dlx")
        for i in range(3):
            m.publish("q", b"m%d" % i)
        assert m.bodies("q") == ["m2"]
        dead = m.get("dead", 10)
        assert [d["payload"] for d in dead] == ["m0", "m1"]
        assert {(e["reason"], e["queue"]) for d in dead for e in death(d)} == {("maxlen", "q")}
    run(body, tmp_path)


def test_max_length_bytes_counts_body_bytes(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.declare("q", max_length_bytes=10)
        for text in (b"aaaa", b"bbbb", b"cc"):  # 10 bytes: at the limit, not over it
            m.publish("q", text)
        assert m.count("q") == 3
        m.publish("q", b"d")  # 11: the head goes
        assert m.bodies("q") == ["bbbb", "cc", "d"]
    run(body, tmp_path)


def test_reject_publish_refuses_the_new_message_and_stores_nothing(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.declare("q", max_length=2, overflow="reject-publish")
        assert not m.publish_refused("q", b"m0")
        assert not m.publish_refused("q", b"m1")
        assert m.publish_refused("q", b"m2")
        assert m.count("q") == 2
        assert m.bodies("q") == ["m0", "m1"]
        assert not m.publish_refused("q", b"m3")  # room again
        assert m.bodies("q") == ["m3"]
    run(body, tmp_path)


def test_reject_publish_by_bytes(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.declare("q", max_length_bytes=8, overflow="reject-publish")
        assert not m.publish_refused("q", b"1234")
        assert not m.publish_refused("q", b"5678")
        assert m.publish_refused("q", b"9")
        assert m.bodies("q") == ["1234", "5678"]
    run(body, tmp_path)


def test_reject_publish_dlx_dead_letters_the_refused_message(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.dead_letter_target()
        m.declare("q", max_length=1, overflow="reject-publish-dlx", dead_letter_exchange="dlx")
        assert not m.publish_refused("q", b"kept")
        assert m.publish_refused("q", b"refused")
        assert m.bodies("q") == ["kept"]
        [dead] = m.get("dead")
        assert dead["payload"] == "refused"
        assert [(e["reason"], e["queue"]) for e in death(dead)] == [("maxlen", "q")]
    run(body, tmp_path)


def test_a_policy_limits_an_existing_queue(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.declare("pq")
        m.vhost.set_policy("limit", "^pq$", {"max-length": 1})
        for i in range(3):
            m.publish("pq", b"m%d" % i)
        assert m.bodies("pq") == ["m2"]
    run(body, tmp_path)


@pytest.mark.parametrize("arguments", [{"max_length": -1}, {"max_length_bytes": -1}, {"overflow": "drop-tail"}])
def test_bad_limit_arguments_are_refused_with_406(tmp_path: Path, arguments: dict) -> None:
    async def body(m: Model) -> None:
        with pytest.raises(BrokerChannelError) as refused:
            m.declare("q", **arguments)
        assert refused.value.kind is PRECONDITION_FAILED
    run(body, tmp_path)
