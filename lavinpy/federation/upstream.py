"""The keys of ``federation-upstream`` and ``federation-upstream-set`` parameters, checked as RabbitMQ
checks them, and the upstreams a federation policy names.

Every problem raises UpstreamError with a text naming the key. Defaults are RabbitMQ's: prefetch-count
1000, reconnect-delay 5 s, ack-mode on-confirm, max-hops 1, queue-type classic.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from lavinpy.wire.uri import parse_url

ACK_MODES = ("on-confirm", "on-publish", "no-ack")
QUEUE_TYPES = ("classic", "quorum")
ALL_SET = "all"  # the implicit set of every upstream of the vhost


class UpstreamError(ValueError):
    """A federation parameter that cannot be used; the text names the key."""


def _number(minimum: float, integer: bool = True) -> Callable[[str, Any], Any]:
    def check(key: str, value: Any) -> Any:
        kinds = (int,) if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds) or value < minimum:
            what = "an integer" if integer else "a number"
            raise UpstreamError(f"{key} should be {what} >= {minimum:g}, not {value!r}")
        return value
    return check


def _boolean(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise UpstreamError(f"{key} should be a boolean, not {value!r}")
    return value


def _string(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise UpstreamError(f"{key} should be a string, not {value!r}")
    return value


def _one_of(choices: tuple[str, ...]) -> Callable[[str, Any], str]:
    def check(key: str, value: Any) -> str:
        if value not in choices:
            raise UpstreamError(f"{key} should be one of {', '.join(choices)}, not {value!r}")
        return str(value)
    return check


def _uris(key: str, value: Any) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(u, str) for u in items):
        raise UpstreamError(f"{key} should be a URI or a non-empty list of URIs, not {value!r}")
    for uri in items:
        if uri.startswith("amqp://") and uri[len("amqp://"):].split("/", 1)[0] == "":
            continue  # this node (no host)
        try:
            parse_url(uri)
        except (ValueError, TypeError) as e:
            raise UpstreamError(f"{key}: {uri.split('@')[-1]!r} is not an AMQP URI: {e}") from None
    return tuple(items)


# RabbitMQ's keys (rabbit_federation_parameters) with their checks; the last three are accepted for
# compatibility (channel-use-mode, resource-cleanup-mode and the old ha-policy) and have no effect.
CHECKS = {
    "uri": _uris,
    "prefetch-count": _number(1),
    "reconnect-delay": _number(0, integer=False),
    "ack-mode": _one_of(ACK_MODES),
    "trust-user-id": _boolean,
    "exchange": _string,
    "queue": _string,
    "consumer-tag": _string,
    "max-hops": _number(1),
    "expires": _number(1),
    "message-ttl": _number(0),
    "bind-nowait": _boolean,
    "queue-type": _one_of(QUEUE_TYPES),
    "channel-use-mode": _one_of(("multiple", "single")),
    "resource-cleanup-mode": _one_of(("default", "never")),
    "ha-policy": _string,
}
FIELDS = {"prefetch-count": "prefetch_count", "reconnect-delay": "reconnect_delay", "ack-mode": "ack_mode",
          "trust-user-id": "trust_user_id", "exchange": "exchange", "queue": "queue",
          "consumer-tag": "consumer_tag", "max-hops": "max_hops", "expires": "expires",
          "message-ttl": "message_ttl", "bind-nowait": "bind_nowait", "queue-type": "queue_type"}


@dataclass(frozen=True)
class Upstream:
    name: str
    uris: tuple[str, ...]
    prefetch_count: int = 1000
    reconnect_delay: float = 5.0
    ack_mode: str = "on-confirm"
    trust_user_id: bool = False
    exchange: str | None = None  # None: the federated exchange's own name
    queue: str | None = None
    consumer_tag: str | None = None
    max_hops: int = 1
    expires: int | None = None
    message_ttl: int | None = None
    bind_nowait: bool = False
    queue_type: str = "classic"


def _checked(value: Mapping[str, Any], what: str, required: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise UpstreamError(f"{what} should be a JSON object, not {value!r}")
    for key in required:
        if key not in value:
            raise UpstreamError(f"{key} is required")
    unknown = sorted(k for k in value if k not in CHECKS and k not in required)
    if unknown:
        raise UpstreamError(f"unrecognised key(s) {', '.join(unknown)}")
    return {k: CHECKS[k](k, v) for k, v in value.items() if k in CHECKS}


def _overrides(checked: Mapping[str, Any]) -> dict[str, Any]:
    return {FIELDS[k]: (float(v) if k == "reconnect-delay" else v) for k, v in checked.items() if k in FIELDS}


def parse_upstream(name: str, value: Any) -> Upstream:
    """A ``federation-upstream`` parameter's value as an Upstream; UpstreamError names the bad key."""
    checked = _checked(value, "federation-upstream", ("uri",))
    return Upstream(name=name, uris=checked["uri"], **_overrides(checked))


def check_upstream_set(value: Any) -> list[dict[str, Any]]:
    """A ``federation-upstream-set`` value: a list of objects naming an ``upstream``, each with keys of
    an upstream that override the upstream's own."""
    if not isinstance(value, list):
        raise UpstreamError(f"federation-upstream-set should be a list of objects, not {value!r}")
    for item in value:
        checked = _checked(item, "each member of the set", ("upstream",))
        _string("upstream", item["upstream"])
        if "uri" in checked:
            raise UpstreamError("uri: a member of a set takes its URIs from its upstream")
    return value


def resolve(policy: Mapping[str, Any], upstreams: Mapping[str, Upstream],
            sets: Mapping[str, list[dict[str, Any]]]) -> tuple[list[Upstream], list[str]]:
    """The upstreams a policy definition names (``federation-upstream`` or ``federation-upstream-set``),
    and what it names that does not exist ("upstream 'x'", "upstream set 'x'")."""
    if isinstance(policy.get("federation-upstream"), str):
        name = policy["federation-upstream"]
        return ([upstreams[name]], []) if name in upstreams else ([], [f"upstream '{name}'"])
    set_name = policy.get("federation-upstream-set")
    if not isinstance(set_name, str):
        return [], []
    if set_name == ALL_SET and set_name not in sets:
        return [upstreams[n] for n in sorted(upstreams)], []
    if set_name not in sets:
        return [], [f"upstream set '{set_name}'"]
    found, missing = [], []
    for member in sets[set_name]:
        base = upstreams.get(member["upstream"])
        if base is None:
            missing.append(f"upstream '{member['upstream']}'")
            continue
        found.append(replace(base, **_overrides({k: v for k, v in member.items() if k in FIELDS})))
    return found, missing
