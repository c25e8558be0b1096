"""x-queue-type quorum: RabbitMQ 4's declaration rules and texts, its settings (default delivery limit,
overflow), the redeclare equivalence of the type, the queue's reported type and the quorum-critical
health check, in process."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from lavinpy.broker.declarations import check_queue_equivalent, validate_queue_declare, with_default_queue_type
from lavinpy.broker.errors import PRECONDITION_FAILED, BrokerChannelError
from lavinpy.broker.settings.arguments import DEFAULT_DELIVERY_LIMIT, QueueSettings, quorum_delivery_limit
from lavinpy.broker.settings.policies import make_policy
from lavinpy.http.context import BROKER, CLUSTER_NODES
from lavinpy.http.routes_health import node_is_quorum_critical
from tests.broker.model_harness import Model, run

Q = {"x-queue-type": "quorum"}
WHERE = "queue 'q' in vhost '/'"


def refusal(arguments: dict[str, Any], *, durable: bool = True, exclusive: bool = False,
            auto_delete: bool = False, server_named: bool = False) -> str:
    with pytest.raises(BrokerChannelError) as info:
        validate_queue_declare("q", "/", durable=durable, exclusive=exclusive, auto_delete=auto_delete,
                               arguments=arguments, server_named=server_named)
    assert info.value.kind is PRECONDITION_FAILED
    return info.value.detail


def test_accepted_arguments() -> None:
    arguments = {**Q, "x-quorum-initial-group-size": 3, "x-delivery-limit": 5, "x-dead-letter-strategy":
                 "at-least-once", "x-max-length": 10, "x-max-length-bytes": 1000, "x-overflow": "reject-publish",
                 "x-single-active-consumer": True, "x-expires": 60000, "x-message-ttl": 1000,
                 "x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": "dead",
                 "x-queue-leader-locator": "balanced", "x-max-in-memory-length": 5}
    assert validate_queue_declare("q", "/", durable=True, exclusive=False, auto_delete=False,
                                  arguments=arguments) == "quorum"
    for overflow in ("drop-head", "reject-publish-dlx"):  # RabbitMQ accepts the last one and ignores it
        validate_queue_declare("q", "/", durable=True, exclusive=False, auto_delete=False,
                               arguments={**Q, "x-overflow": overflow})
    validate_queue_declare("q", "/", durable=True, exclusive=False, auto_delete=False,
                           arguments={**Q, "x-delivery-limit": -1, "x-dead-letter-strategy": "at-most-once"})


@pytest.mark.parametrize("flags, prop", [
    ({"auto_delete": True}, "auto-delete"),
    ({"exclusive": True}, "exclusive-owner"),
    ({"durable": False}, "non-durable"),
    ({"durable": False, "exclusive": True, "auto_delete": True}, "auto-delete"),  # RabbitMQ's order
    ({"durable": False, "exclusive": True}, "exclusive-owner"),
])
def test_flags_refused(flags: dict[str, bool], prop: str) -> None:
    assert refusal(Q, **flags) == f"invalid property '{prop}' for {WHERE}"


@pytest.mark.parametrize("name, value", [
    ("x-max-priority", 10), ("x-queue-mode", "lazy"), ("x-queue-master-locator", "min-masters"),
    ("x-max-age", "1D"), ("x-stream-max-segment-size-bytes", 1000), ("x-initial-cluster-size", 3),
    ("x-queue-version", 2), ("x-max-priority", "not even an int"),
])
def test_other_types_arguments_refused(name: str, value: Any) -> None:
    assert refusal({**Q, name: value}) == f"invalid arg '{name}' for {WHERE} of queue type rabbit_quorum_queue"


@pytest.mark.parametrize("name, value, reason", [
    ("x-quorum-initial-group-size", 0, "{value_zero,0}"),
    ("x-quorum-initial-group-size", -1, "{value_negative,-1}"),
    ("x-quorum-initial-group-size", "3", "{unacceptable_type,longstr}"),
    ("x-dead-letter-strategy", "exactly-once", "invalid_dlx_strategy"),
    ("x-dead-letter-strategy", 1, "{unacceptable_type,long}"),
    ("x-overflow", "drop-tail", "invalid_overflow"),
    ("x-max-length", -1, "{value_negative,-1}"),
    ("x-delivery-limit", -2, "{value_negative,-2}"),
    ("x-queue-leader-locator", "random", "invalid_queue_locator_arg"),
])
def test_bad_values_refused(name: str, value: Any, reason: str) -> None:
    assert refusal({**Q, name: value}) == f"invalid arg '{name}' for {WHERE}: {reason}"


def test_values_are_checked_before_foreign_keys_and_flags() -> None:
    text = refusal({**Q, "x-max-priority": 5, "x-max-length": -1}, durable=False)
    assert text == f"invalid arg 'x-max-length' for {WHERE}: {{value_negative,-1}}"
    text = refusal({**Q, "x-max-priority": 5}, durable=False)
    assert text.endswith("of queue type rabbit_quorum_queue")


def test_server_named_refused() -> None:
    assert refusal(Q, server_named=True) == "Cannot declare a server-named queue for type rabbit_quorum_queue"


def test_classic_spelled_out_is_classic() -> None:
    assert validate_queue_declare("q", "/", durable=False, exclusive=True, auto_delete=True,
                                  arguments={"x-queue-type": "classic"}) == "classic"


def test_redeclare_type_equivalence() -> None:
    # classic given or left out are the same queue type
    check_queue_equivalent(True, False, {}, "q", "/", True, False, {"x-queue-type": "classic"})
    check_queue_equivalent(True, False, {"x-queue-type": "classic"}, "q", "/", True, False, {})
    check_queue_equivalent(True, False, dict(Q), "q", "/", True, False, dict(Q))
    with pytest.raises(BrokerChannelError) as info:
        check_queue_equivalent(True, False, dict(Q), "q", "/", True, False, {})
    assert info.value.detail == (f"inequivalent arg 'x-queue-type' for {WHERE}: "
                                     "received 'classic' but current is 'quorum'")
    with pytest.raises(BrokerChannelError) as info:
        check_queue_equivalent(True, False, {}, "q", "/", True, False, dict(Q))
    assert "received 'quorum' but current is 'classic'" in info.value.detail
    with pytest.raises(BrokerChannelError) as info:
        check_queue_equivalent(True, False, dict(Q), "q", "/", True, False, {**Q, "x-delivery-limit": 3})
    assert "inequivalent arg 'x-delivery-limit'" in info.value.detail


@pytest.mark.parametrize("argument, policy, limit", [
    (None, None, DEFAULT_DELIVERY_LIMIT), (5, None, 5), (None, 7, 7), (5, 7, 5), (9, 7, 7),
    (-1, None, None), (None, -1, None), (-1, 7, 7), (5, -1, 5), (-1, -1, None), (0, None, 0),
])
def test_delivery_limit(argument: int | None, policy: int | None, limit: int | None) -> None:
    assert quorum_delivery_limit(argument, policy) == limit


def test_settings() -> None:
    settings = QueueSettings.resolve(Q)
    assert (settings.queue_type, settings.delivery_limit, settings.overflow) == ("quorum", 20, "drop-head")
    assert QueueSettings.resolve({**Q, "x-overflow": "reject-publish-dlx"}).overflow == "drop-head"
    # a quorum queue's overflow comes from the policy first
    assert QueueSettings.resolve({**Q, "x-overflow": "drop-head"}, {"overflow": "reject-publish"}).overflow \
        == "reject-publish"
    assert QueueSettings.resolve({**Q, "x-delivery-limit": -1}).delivery_limit is None
    assert QueueSettings.resolve({}).delivery_limit is None  # classic queues keep no default


def test_policy_apply_to_quorum_queues() -> None:
    policy = make_policy("p", ".*", {"max-length": 1}, 0, "quorum_queues")
    assert policy.matches("q", "queue", "quorum")
    assert not policy.matches("q", "queue", "classic")
    assert not policy.matches("q", "queue", "stream")


def test_quorum_queue_in_the_model(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        queue = m.declare("q", durable=True, queue_type="quorum")
        assert queue.kind == "quorum"
        assert queue.settings.delivery_limit == 20
        m.publish("q", b"job", delivery_mode=2)
        counts = []
        for _ in range(3):
            [got] = m.get("q", ackmode="reject_requeue_true")
            counts.append(got["properties"].get("headers", {}).get("x-delivery-count"))
        assert counts == [None, 1, 2]
        m.reopen()
        queue = m.vhost.get_queue("q")
        assert (queue.kind, queue.message_count) == ("quorum", 1)
        assert m.declare("plain", durable=True).kind == "classic"
    run(body, tmp_path)


def test_default_limit_drops_after_twenty_returns(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.dead_letter_target()
        m.declare("q", durable=True, queue_type="quorum", dead_letter_exchange="dlx")
        m.publish("q", b"job")
        for _ in range(DEFAULT_DELIVERY_LIMIT + 1):
            m.get("q", ackmode="reject_requeue_true")
        assert (m.count("q"), m.count("dead")) == (0, 1)
    run(body, tmp_path)


def test_node_is_quorum_critical(tmp_path: Path) -> None:
    """Only a cluster leader with no other member in sync is critical, and only with quorum queues."""
    async def body(m: Model) -> None:
        async def check(nodes: list[dict[str, Any]] | None) -> tuple[int, dict[str, Any]]:
            request = SimpleNamespace(app={BROKER: m.broker, CLUSTER_NODES: None if nodes is None else lambda: nodes})
            response = await node_is_quorum_critical(request)  # type: ignore[arg-type]
            return response.status, json.loads(response.text or "{}")

        alone = [{"self": True, "role": "leader", "in_sync": True}, {"self": False, "role": "follower",
                                                                        "in_sync": False}]
        synced = [alone[0], {"self": False, "role": "follower", "in_sync": True}]
        follower = [{"self": True, "role": "follower", "in_sync": True}, {"self": False, "role": "leader"}]
        assert await check(None) == (200, {"status": "ok", "reason": "single node cluster"})
        assert (await check(alone))[0] == 200  # no quorum queue yet
        m.declare("qq", durable=True, queue_type="quorum")
        status, reply = await check(alone)
        assert status == 503 and reply["queues"] == [{"name": "qq", "virtual_host": "/", "type": "quorum"}]
        assert reply["reason"] == "There are quorum queues that would lose their quorum if the target node is shut down"
        assert (await check(synced))[0] == 200
        assert (await check(follower))[0] == 200
    run(body, tmp_path)


def test_vhost_default_queue_type() -> None:
    flags = {"durable": True, "exclusive": False, "auto_delete": False}
    assert with_default_queue_type({}, "quorum", **flags) == Q
    assert with_default_queue_type({}, None, **flags) == {}
    assert with_default_queue_type({"x-queue-type": "classic"}, "quorum", **flags) == {"x-queue-type": "classic"}
    # a declaration quorum cannot take falls back to classic, as in RabbitMQ
    assert with_default_queue_type({}, "quorum", durable=True, exclusive=True, auto_delete=False) == \
        {"x-queue-type": "classic"}
    assert with_default_queue_type({}, "quorum", durable=False, exclusive=False, auto_delete=False) == \
        {"x-queue-type": "classic"}
