"""A vhost's policies: ``policies.json``, validation, matching and change notification.

A policy applies the keys of its definition (message-ttl, max-length, dead-letter-exchange, ...) to the
queues and/or exchanges whose name its pattern matches (a regular-expression search, as RabbitMQ's
``re:run``). At most one policy applies to an object: the highest priority wins. RabbitMQ leaves ties
undefined; lavinpy picks the policy whose name sorts first, so the choice is stable across restarts.
A queue key's check and how its value combines with a declare argument come from the one table of queue
arguments (``queue_arguments``); the exchange and federation keys are checked here.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lavinpy.broker.settings import retries
from lavinpy.broker.settings.names import name_too_long
from lavinpy.broker.settings.queue_arguments import POLICY_CHECKS, is_int, string_named
from lavinpy.broker.settings.refused_arguments import refused_argument
from lavinpy.store.jsonfile import read_json, write_json_atomic

log = logging.getLogger("lavinpy.policies")

POLICIES_FILE = "policies.json"
APPLY_TO = ("all", "queues", "exchanges", "classic_queues", "quorum_queues", "streams")
_QUEUE_TYPE_APPLY_TO = {"classic": "classic_queues", "quorum": "quorum_queues", "stream": "streams"}


class PolicyError(ValueError):
    """A policy cannot be set: the message says which field is wrong and why."""


# Definition keys lavinpy understands, with RabbitMQ's validation rules. queue-mode and queue-version
# are accepted for compatibility with RabbitMQ definitions and have no effect.
# max-priority and single-active-consumer are not policy keys in RabbitMQ either: they decide how a
# queue is built, so only a declare argument can set them.
VALIDATORS: dict[str, Callable[[Any], str | None]] = {
    **POLICY_CHECKS,  # the queue keys: queue_arguments.QUEUE_ARGUMENTS
    "alternate-exchange": string_named("alternate exchange name"),
    # Federation (lavinpy.federation): the upstream, or the set of upstreams ("all": every one), an
    # exchange is fed from.
    "federation-upstream": string_named("federation upstream name"),
    "federation-upstream-set": string_named("federation upstream set name"),
    # Delayed retries (broker/settings/retries.py): RabbitMQ 4.3's type/min/max, lavinpy's multiplier and jitter.
    **retries.policy_validators(),
}

# RabbitMQ-only keys whose purpose lavinpy's design already serves (mirroring and placement: the
# cluster replicates every durable queue; queue modes and in-memory limits: messages live on disk and
# are paged in on demand). Accepted with any value, kept in the definition and exported back, and
# reported as not needed by definitions imports.
NOT_NEEDED_KEYS = frozenset({
    "ha-mode", "ha-params", "ha-sync-mode", "ha-sync-batch-size", "ha-promote-on-shutdown",
    "ha-promote-on-failure", "queue-master-locator", "queue-leader-locator", "max-in-memory-length",
    "max-in-memory-bytes", "initial-cluster-size", "target-group-size",
})
for _key in NOT_NEEDED_KEYS:
    VALIDATORS[_key] = lambda value: None


@dataclass(frozen=True)
class Policy:
    name: str
    pattern: str
    definition: Mapping[str, Any]
    priority: int = 0
    apply_to: str = "all"
    _regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_regex", re.compile(self.pattern))

    def applies_to(self, kind: str, queue_type: str = "classic") -> bool:
        """Whether the policy is for a ``kind`` ("queue" or "exchange") object of that queue type."""
        if self.apply_to == "all":
            return True
        if kind == "exchange":
            return self.apply_to == "exchanges"
        return self.apply_to == "queues" or self.apply_to == _QUEUE_TYPE_APPLY_TO.get(queue_type)

    def matches(self, name: str, kind: str, queue_type: str = "classic") -> bool:
        return self.applies_to(kind, queue_type) and self._regex.search(name) is not None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "pattern": self.pattern, "apply-to": self.apply_to,
                "priority": self.priority, "definition": dict(self.definition)}


def make_policy(name: str, pattern: str, definition: Mapping[str, Any], priority: int = 0,
                apply_to: str = "all",
                validators: Mapping[str, Callable[[Any], str | None]] | None = None) -> Policy:
    """A validated Policy; PolicyError names the bad field. ``validators``: the keys allowed (the
    policy keys unless given: operator policies allow fewer)."""
    validators = VALIDATORS if validators is None else validators
    if not isinstance(name, str) or not name:
        raise PolicyError("policy name must be a non-empty string")
    too_long = name_too_long("policy name", name)
    if too_long is not None:
        raise PolicyError(too_long)
    if not is_int(priority):
        raise PolicyError(f"policy '{name}': {priority!r} priority must be a number")
    if apply_to not in APPLY_TO:
        raise PolicyError(f"policy '{name}': apply-to '{apply_to}' unrecognised; should be one of: "
                          + ", ".join(f"'{a}'" for a in APPLY_TO[1:]) + ", or 'all'")
    if not isinstance(pattern, str):
        raise PolicyError(f"policy '{name}': pattern must be a string, not {pattern!r}")
    try:
        re.compile(pattern)
    except re.error as err:
        raise PolicyError(f"policy '{name}': pattern {pattern!r} is not a valid regular expression: {err}")
    if not isinstance(definition, Mapping):
        raise PolicyError(f"policy '{name}': definition must be a dictionary: {definition!r}")
    if not definition:
        raise PolicyError(f"policy '{name}': no policy provided")
    for key in sorted(definition):
        refused = refused_argument("policy", {key: definition[key]})
        if refused is not None:
            raise PolicyError(f"policy '{name}': '{key}' is not supported by lavinpy ({refused.reason})")
    unknown = sorted(k for k in definition if k not in validators)
    if unknown:
        verb = "is not a recognised policy setting" if len(unknown) == 1 else "are not recognised policy settings"
        raise PolicyError(f"policy '{name}': {', '.join(repr(k) for k in unknown)} {verb}")
    if "federation-upstream" in definition and "federation-upstream-set" in definition:
        raise PolicyError(f"policy '{name}': cannot specify federation-upstream and federation-upstream-set together")
    for key in sorted(definition):
        problem = validators[key](definition[key])
        if problem is not None:
            raise PolicyError(f"policy '{name}': {key}: {problem}")
    return Policy(name, pattern, dict(definition), priority, apply_to)


Listener = Callable[[str], None]


class PolicyStore:
    """The policies of one vhost, kept in ``policies.json`` (written atomically on every change)."""

    def __init__(self, path: Path, validators: Mapping[str, Callable[[Any], str | None]] | None = None) -> None:
        self.path = Path(path)
        self.validators = VALIDATORS if validators is None else validators
        self._policies: dict[str, Policy] = {}
        self._listeners: list[Listener] = []

    def load(self) -> None:
        """Read the file. A bad entry is logged and skipped: one typo must not stop the vhost."""
        entries = read_json(self.path, [])
        if not isinstance(entries, list):
            raise ValueError(f"{self.path}: expected a JSON list of policies")
        self._policies.clear()
        for entry in entries:
            try:
                policy = make_policy(entry["name"], entry["pattern"], entry["definition"],
                                     entry.get("priority", 0), entry.get("apply-to", "all"), self.validators)
            except (PolicyError, KeyError, TypeError, AttributeError) as err:
                log.error("%s: ignoring policy entry %r: %s", self.path, entry, err)
                continue
            self._policies[policy.name] = policy

    def set(self, name: str, pattern: str, definition: Mapping[str, Any], priority: int = 0,
            apply_to: str = "all") -> Policy:
        """Add or replace a policy, save the file, then tell the listeners."""
        policy = make_policy(name, pattern, definition, priority, apply_to, self.validators)
        previous = self._policies.get(name)
        self._policies[name] = policy
        try:
            self._save()
        except BaseException:
            if previous is None:
                del self._policies[name]
            else:
                self._policies[name] = previous
            raise
        self._notify(name)
        return policy

    def delete(self, name: str) -> bool:
        """Remove a policy; False when there is none of that name."""
        policy = self._policies.pop(name, None)
        if policy is None:
            return False
        try:
            self._save()
        except BaseException:
            self._policies[name] = policy
            raise
        self._notify(name)
        return True

    def get(self, name: str) -> Policy | None:
        return self._policies.get(name)

    def list(self) -> list[Policy]:
        """All policies, highest priority first (then by name)."""
        return sorted(self._policies.values(), key=lambda p: (-p.priority, p.name))

    def match(self, name: str, kind: str, queue_type: str = "classic") -> Policy | None:
        """The policy that applies to the queue/exchange ``name``, or None."""
        best: Policy | None = None
        for policy in self._policies.values():
            if policy.matches(name, kind, queue_type) and (
                    best is None or (policy.priority, best.name) > (best.priority, policy.name)):
                best = policy
        return best

    def subscribe(self, callback: Listener) -> Callable[[], None]:
        """Call ``callback(policy_name)`` after each change; returns a function that unsubscribes."""
        self._listeners.append(callback)
        return lambda: self._listeners.remove(callback) if callback in self._listeners else None

    def _notify(self, name: str) -> None:
        for callback in list(self._listeners):
            try:
                callback(name)
            except Exception:  # a failing listener must not undo a saved change
                log.exception("policy listener failed after a change to %r", name)

    def _save(self) -> None:
        write_json_atomic(self.path, [p.to_json() for p in sorted(self._policies.values(), key=lambda p: p.name)])

    def __len__(self) -> int:
        return len(self._policies)
