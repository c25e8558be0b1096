"""Operator policies: a vhost's second set of policies, set by operators, that caps what users' policies
and declare arguments ask for (RabbitMQ's ``/api/operator-policies``).

Only the keys RabbitMQ allows in an operator policy are accepted. For each queue the matching operator
policy (highest priority, as for policies) is merged with the matching policy: where both give a numeric
limit the smaller wins, otherwise the operator policy's value is used. The declare argument then meets
the merged definition as it meets a policy (the smaller wins), so the strictest of the three applies.
RabbitMQ-only keys (max-in-memory-*, target-group-size, ha-*, queue-master-locator) are accepted and
have no effect: lavinpy's queues keep no messages in memory and replicate every durable queue.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .policies import VALIDATORS, Policy, PolicyStore
from .queue_arguments import int_at_least, string_named

OPERATOR_POLICIES_FILE = "operator_policies.json"
# Keys merged by taking the smaller value (RabbitMQ's merge strategy for each of them).
SMALLER_WINS = ("expires", "message-ttl", "max-length", "max-length-bytes", "delivery-limit",
                "max-in-memory-length", "max-in-memory-bytes")
NO_EFFECT_KEYS = ("max-in-memory-length", "max-in-memory-bytes", "target-group-size", "ha-mode", "ha-params",
                  "ha-sync-mode", "queue-master-locator")

OPERATOR_VALIDATORS: dict[str, Callable[[Any], str | None]] = {
    "expires": VALIDATORS["expires"],
    "message-ttl": VALIDATORS["message-ttl"],
    "max-length": VALIDATORS["max-length"],
    "max-length-bytes": VALIDATORS["max-length-bytes"],
    "delivery-limit": VALIDATORS["delivery-limit"],
    "max-in-memory-length": int_at_least(0, "maximum in-memory length"),
    "max-in-memory-bytes": int_at_least(0, "maximum in-memory bytes"),
    "target-group-size": int_at_least(1, "target group size"),
    "ha-mode": string_named("ha-mode"),
    "ha-params": lambda value: None,
    "ha-sync-mode": string_named("ha-sync-mode"),
    "queue-master-locator": string_named("queue-master-locator"),
}


def operator_policy_store(vhost_path: Path) -> PolicyStore:
    """A vhost's operator policies, kept in ``operator_policies.json`` beside its policies."""
    return PolicyStore(vhost_path / OPERATOR_POLICIES_FILE, OPERATOR_VALIDATORS)


def merge_definitions(policy: Mapping[str, Any] | None, operator: Mapping[str, Any] | None) -> dict[str, Any]:
    """The effective policy definition: the policy's keys, capped by the operator policy's."""
    merged = dict(policy or {})
    for key, value in (operator or {}).items():
        mine = merged.get(key)
        if key in SMALLER_WINS and _is_int(mine) and _is_int(value):
            merged[key] = min(mine, value)
        else:
            merged[key] = value
    return merged


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def queue_policy_info(policy: Policy | None, operator: Policy | None) -> dict[str, Any]:
    """The fields RabbitMQ's queue listing adds: operator_policy and effective_policy_definition."""
    return {"operator_policy": operator.name if operator else None,
            "effective_policy_definition": merge_definitions(policy.definition if policy else None,
                                                             operator.definition if operator else None)}


def operator_policy_json(vhost: str, policy: Policy) -> dict[str, Any]:
    return {"vhost": vhost, **policy.to_json()}
