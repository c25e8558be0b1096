"""Delayed retries: a returned message waits before it is ready again (queues wing, a value module).

RabbitMQ 4.3's quorum-queue arguments and policy keys, with their meaning:

- ``x-delayed-retry-type`` (policy ``delayed-retry-type``): which returns are delayed. ``failed``: a
  settlement that says processing failed (AMQP 0-9-1 ``basic.reject`` with requeue; RabbitMQ 4.3
  counts it in the delivery count); ``returned``: one that gives the message back without calling it
  a failure (``basic.nack`` with requeue, ``basic.recover``, a channel or connection that closes with
  the message unacknowledged, a consumer timeout); ``all``: both; ``disabled`` (the default): none.
- ``x-delayed-retry-min`` / ``x-delayed-retry-max`` (ms): RabbitMQ's linear back-off,
  ``min(min * n, max)`` for the n-th return of the message.

lavinpy's additions, on every queue kind but streams (which refuse them): ``x-delayed-retry-multiplier``
(LavinMQ's name and meaning: unset linear; 1 constant; above 1 exponential, ``min * multiplier^(n-1)``),
``x-delayed-retry-jitter`` (a percentage j, 0-100: the delay is drawn from
``[delay * (1 - j/100), delay]``, so consumers retrying together spread out), and delays up to ten
years (RabbitMQ's TTL ceiling), not only the 49.7 days of a 32-bit timer. ``x-delayed-retry-min``
alone (LavinMQ's form) turns retries on for every return (``all``). The argument wins over the policy
key for each setting.
"""

from __future__ import annotations

import decimal
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

RETRY_TYPES = ("disabled", "returned", "failed", "all")
MAX_DELAY = 315_360_000_000  # ten years in ms, RabbitMQ's TTL ceiling
DEFAULT_MIN = 1000  # ms, when a type is given without x-delayed-retry-min (lavinpy's choice)
SETTINGS = ("type", "min", "max", "multiplier", "jitter")
ARGUMENTS = tuple(f"x-delayed-retry-{name}" for name in SETTINGS)
POLICY_KEYS = tuple(f"delayed-retry-{name}" for name in SETTINGS)


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return value if isinstance(value, str) else None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    # an AMQP integer, double or decimal (pika sends a Decimal; it cannot send a float); NaN is none
    if isinstance(value, decimal.Decimal):
        return value.is_finite()
    return (_is_int(value) or isinstance(value, float)) and value == value


def _type_reason(value: Any) -> str | None:
    text = _text(value)
    if text is None:
        return "{unacceptable_type,not_a_string}"
    return None if text in RETRY_TYPES else "invalid_delayed_retry_type"


def _delay_reason(value: Any) -> str | None:
    if not _is_int(value):
        return "{unacceptable_type,not_an_integer}"
    if value < 0:
        return f"{{value_negative,{value}}}"
    return f"{{value_too_large,{value}}}" if value > MAX_DELAY else None


def _multiplier_reason(value: Any) -> str | None:
    if not _is_number(value):
        return "{unacceptable_type,not_a_number}"
    return None if 1 <= value <= 1000 else f"{{out_of_range,{value}}}"


def _jitter_reason(value: Any) -> str | None:
    if not _is_number(value):
        return "{unacceptable_type,not_a_number}"
    return None if 0 <= value <= 100 else f"{{out_of_range,{value}}}"


_REASONS: dict[str, Callable[[Any], str | None]] = {
    "type": _type_reason, "min": _delay_reason, "max": _delay_reason, "multiplier": _multiplier_reason,
    "jitter": _jitter_reason,
}


def argument_problem(arguments: Mapping[str, Any]) -> tuple[str, str] | None:
    """The first bad retry argument of a declaration: (its name, the reason term), or None."""
    for setting, name in zip(SETTINGS, ARGUMENTS, strict=True):
        if name in arguments:
            reason = _REASONS[setting](arguments[name])
            if reason is not None:
                return name, reason
    low, high = arguments.get("x-delayed-retry-min"), arguments.get("x-delayed-retry-max")
    if isinstance(low, int) and isinstance(high, int) and high < low:
        return "x-delayed-retry-max", f"{{less_than_min,{high}}}"
    return None


def policy_validators() -> dict[str, Callable[[Any], str | None]]:
    """The policy keys' checks, in the policy store's form (a problem text or None)."""
    def check(setting: str, key: str) -> Callable[[Any], str | None]:
        def problem(value: Any) -> str | None:
            reason = _REASONS[setting](value)
            return None if reason is None else f"{value!r} is not a valid {key} value {reason}"
        return problem
    return {key: check(setting, key) for setting, key in zip(SETTINGS, POLICY_KEYS, strict=True)}


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """A queue's delayed retries: which returns wait, and how long the n-th one waits."""

    kind: str  # returned, failed or all
    min_ms: int
    max_ms: int | None = None
    multiplier: float | None = None  # None: linear
    jitter: float = 0.0  # a fraction (the argument is a percentage)

    def applies(self, failed: bool) -> bool:
        """Whether a return (``failed``: basic.reject with requeue) waits."""
        return self.kind == "all" or (self.kind == "failed") == failed

    def delay(self, returns: int, draw: Callable[[], float] = random.random) -> int:
        """The wait in ms before the ``returns``-th return (1 for the first) is ready again."""
        n = max(1, returns)
        cap = MAX_DELAY if self.max_ms is None else min(self.max_ms, MAX_DELAY)
        wait: float
        if self.multiplier is None:
            wait = self.min_ms * n
        elif self.multiplier == 1 or self.min_ms == 0:
            wait = self.min_ms
        else:
            # Past the cap after at most ~60 doublings: stop multiplying there (no huge powers).
            wait = float(self.min_ms)
            for _ in range(n - 1):
                wait *= self.multiplier
                if wait >= cap:
                    break
        delay = min(int(wait), cap)
        if self.jitter:
            delay -= int(delay * self.jitter * draw())
        return delay


def resolve(arguments: Mapping[str, Any], policy: Mapping[str, Any]) -> RetryPolicy | None:
    """The queue's retries from validated arguments and its policy (the argument wins), or None."""
    values: dict[str, Any] = {}
    for setting, name, key in zip(SETTINGS, ARGUMENTS, POLICY_KEYS, strict=True):
        value = arguments.get(name)
        if value is None or _REASONS[setting](value) is not None:
            value = policy.get(key)
            if value is not None and _REASONS[setting](value) is not None:
                value = None
        if value is not None:
            values[setting] = value
    kind = _text(values.get("type"))
    if kind is None:
        if "min" not in values:
            return None
        kind = "all"  # LavinMQ's form: a minimum delay alone turns retries on
    if kind == "disabled":
        return None
    min_ms = values.get("min", DEFAULT_MIN)
    max_ms = values.get("max")
    if max_ms is not None and max_ms < min_ms:
        max_ms = min_ms
    multiplier = values.get("multiplier")
    return RetryPolicy(kind, min_ms, max_ms, float(multiplier) if multiplier is not None else None,
                       float(values.get("jitter", 0)) / 100)
