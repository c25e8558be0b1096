"""Arguments RabbitMQ 4.4 or LavinMQ 2.9 document that lavinpy does not honour: refused by name.

An application written for either broker must not silently behave differently here, so each such
queue, exchange or consumer argument and policy key is refused with 406 PRECONDITION_FAILED naming it
and saying why (a definitions import reports it the same way, naming the object). Unknown ``x-``
arguments that neither broker documents stay accepted, as RabbitMQ accepts them. A value that asks
for nothing (``x-delayed-exchange: false``) is accepted.

This is the one table: the queue declaration, the exchange declaration, the consumer and the policy
checks read it, and docs/arguments.md lists the same rows (a test holds the two together).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Short, so that the reply text (at most 255 bytes) keeps them whole; docs/arguments.md says what an
# application would see instead.


@dataclass(frozen=True, slots=True)
class Refused:
    name: str  # as given: an x- argument, or a policy key
    kinds: frozenset[str]  # "queue", "exchange", "consumer", "policy"
    reason: str
    inert: tuple[Any, ...] = ()  # values that ask for nothing, accepted


def _row(name: str, kinds: str, reason: str, *inert: Any) -> Refused:
    return Refused(name, frozenset(kinds.split()), reason, inert)


REFUSED: tuple[Refused, ...] = (
    _row("x-delayed-exchange", "exchange", "use the exchange type x-delayed-message", False),
)

_BY_KIND: dict[str, dict[str, Refused]] = {}
for _refused in REFUSED:
    for _kind in _refused.kinds:
        _BY_KIND.setdefault(_kind, {})[_refused.name] = _refused


def refused_argument(kind: str, arguments: Mapping[str, Any] | None) -> Refused | None:
    """The first argument of ``arguments`` (in their order) that a ``kind`` object refuses, if any."""
    table = _BY_KIND.get(kind)
    if not arguments or table is None:
        return None
    for name, value in arguments.items():
        refused = table.get(name)
        if refused is not None and not _inert(value, refused.inert):
            return refused
    return None


def _inert(value: Any, inert: tuple[Any, ...]) -> bool:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return any(type(value) is type(choice) and value == choice for choice in inert)


def refusal_text(refused: Refused, where: str) -> str:
    """RabbitMQ's form of an argument error, with the reason: "invalid arg 'x-cache-size' for queue 'q'
    in vhost '/': not supported by lavinpy (message deduplication is not implemented)"."""
    return f"invalid arg '{refused.name}' for {where}: not supported by lavinpy ({refused.reason})"
