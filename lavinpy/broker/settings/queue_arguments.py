"""The one table of queue arguments: for each, its declare check, its policy key and check, how a declare
argument and a policy value combine, the ``QueueSettings`` field it sets and the queue types that take it.

Declare validation (``arguments.validate_queue_arguments``, in the table's order, which is RabbitMQ's),
policy validation (``policies.VALIDATORS``), the effective settings (``arguments.QueueSettings.resolve``)
and the arguments each queue type accepts (``quorum_arguments``, ``queues.stream_arguments``) are read
from it: a new queue argument is one row here (and its effect in the queue kind that takes it).

Declare checks return RabbitMQ's reason term as Erlang prints it ("{value_negative,-1}"); policy checks
return the management API's message ("-1 is not a valid message TTL"). Values arrive decoded by pamqp,
so wire integer widths are not known here: any int (but not a bool) counts as an AMQP integer type.
"""

from __future__ import annotations

import datetime
import decimal
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .names import name_too_long

MAX_EXPIRY = 315_360_000_000  # RabbitMQ's TTL/expiry ceiling since 3.11 (ten years), in ms
MAX_PRIORITY = 255
OVERFLOW_MODES = ("drop-head", "reject-publish", "reject-publish-dlx")
QUEUE_MODES = ("default", "lazy")
DEAD_LETTER_STRATEGIES = ("at-most-once", "at-least-once")
_MAX_AGE = re.compile(r"([0-9]+)([YMDhms])")
_AGE_UNIT_MS = {"Y": 365 * 86_400_000, "M": 30 * 86_400_000, "D": 86_400_000, "h": 3_600_000, "m": 60_000,
                "s": 1000}

Check = Callable[[Any], str | None]

# How a declare argument and a policy value combine (RabbitMQ's precedence).
SMALLER = "smaller"  # both may set it; the smaller number wins (the numeric limits)
ARGUMENT_FIRST = "argument first"  # both may set it; the argument wins
ARGUMENT_ONLY = "argument only"  # only the argument sets it: it decides how the queue is built
OTHER = "other"  # taken by a queue type's own rules (quorum_arguments), or accepted with no effect

CLASSIC, QUORUM, STREAM = "classic", "quorum", "stream"


# --- values as AMQP decoded them ------------------------------------------------------------------

def amqp_type_name(value: Any) -> str:
    """RabbitMQ's name for the field type a decoded value came in as (the closest one)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, decimal.Decimal):
        return "decimal"
    if isinstance(value, str | bytes):
        return "longstr"
    if isinstance(value, bytearray):
        return "binary"
    if isinstance(value, datetime.datetime):
        return "timestamp"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list | tuple):
        return "array"
    if value is None:
        return "void"
    return type(value).__name__


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def text_of(value: Any) -> str | None:
    """A longstr argument as str (bytes must be UTF-8), or None when it is not a string."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None


def parse_max_age(value: Any) -> int:
    """A stream retention age or interval ("7D", "12h", "30m", "10s", "1Y", "1M") in ms.

    The one parser of x-max-age, the max-age policy key and interval x-stream-offset values. As in
    RabbitMQ a month is 30 days and a year 365 days; the number must be positive. ValueError if invalid.
    """
    text = text_of(value)
    if text is None:
        raise ValueError(f"expected a string such as '7D', not {value!r}")
    match = _MAX_AGE.fullmatch(text)
    if match is None or int(match.group(1)) <= 0:
        raise ValueError(f"invalid max age '{text}': a positive integer followed by Y, M, D, h, m or s")
    return int(match.group(1)) * _AGE_UNIT_MS[match.group(2)]


# --- declare checks: RabbitMQ's reason term, or None when the value is fine -------------------------

def term(tag: str, value: Any) -> str:
    """``{tag,value}`` as Erlang prints it (strings quoted, numbers bare)."""
    shown = f'"{value}"' if isinstance(value, str) else str(value)
    return f"{{{tag},{shown}}}"


def bad_type(value: Any) -> str:
    """``{unacceptable_type,longstr}``: the type is an atom, printed bare."""
    return f"{{unacceptable_type,{amqp_type_name(value)}}}"


def int_reason(value: Any) -> str | None:
    return None if is_int(value) else bad_type(value)


def non_negative_int_reason(value: Any) -> str | None:
    reason = int_reason(value)
    if reason is None and value < 0:
        return term("value_negative", value)
    return reason


def expiry_reason(value: int) -> str | None:
    if value < 0:
        return term("value_negative", value)
    if value > MAX_EXPIRY:
        return term("value_too_large", value)
    return None


def _ttl_reason(value: Any) -> str | None:
    return int_reason(value) or expiry_reason(value)


def _expires_reason(value: Any) -> str | None:
    reason = int_reason(value)
    if reason is None and value == 0:
        return term("value_zero", value)
    return reason or expiry_reason(value)


def _max_priority_reason(value: Any) -> str | None:
    reason = non_negative_int_reason(value)
    if reason is None and value > MAX_PRIORITY:
        return term("max_value_exceeded", value)
    return reason


def _delivery_limit_reason(value: Any) -> str | None:
    # -1 means "no limit" (RabbitMQ 4 quorum queues accept it); anything lower is an error.
    reason = int_reason(value)
    if reason is None and value < -1:
        return term("value_negative", value)
    return reason


def _short_string_reason(value: Any) -> str | None:
    """A string that names an exchange or is a routing key: at most 255 bytes (AMQP's short string)."""
    text = text_of(value)
    return bad_type(value) if text is None else name_too_long("the value", text)


def _bool_reason(value: Any) -> str | None:
    return None if isinstance(value, bool) else bad_type(value)


def _choice_reason(choices: tuple[str, ...], error: str) -> Check:
    def check(value: Any) -> str | None:
        text = text_of(value)
        if text is None:
            return bad_type(value)
        return None if text in choices else error
    return check


def _max_age_reason(value: Any) -> str | None:
    text = text_of(value)
    if text is None:
        return bad_type(value)
    try:
        parse_max_age(text)
    except ValueError:
        return "invalid_max_age"
    return None


# --- policy checks: the management API's message, or None -------------------------------------------

def int_at_least(minimum: int, what: str) -> Check:
    def check(value: Any) -> str | None:
        return None if is_int(value) and value >= minimum else f"{value!r} is not a valid {what}"
    return check


def string_named(what: str) -> Check:
    def reason(value: Any) -> str | None:
        if not isinstance(value, str):
            return f"{value!r} is not a valid {what}"
        return name_too_long(what, value)
    return reason


def one_of(choices: tuple[str, ...], what: str) -> Check:
    return lambda value: None if value in choices else f"{value!r} is not a valid {what} value"


def _policy_max_age(value: Any) -> str | None:
    try:
        parse_max_age(value)
    except (TypeError, ValueError):
        return f"{value!r} is not a valid max age"
    return None


def _queue_version(value: Any) -> str | None:
    return None if value in (1, 2) else f"{value!r} is not a valid queue version"


# --- values for QueueSettings -----------------------------------------------------------------------

def int_or_none(value: Any) -> int | None:
    return value if is_int(value) else None


def age_or_none(value: Any) -> int | None:
    try:
        return parse_max_age(value)
    except ValueError:
        return None


def _is_true(value: Any) -> bool:
    return value is True


# --- the table --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class QueueArgument:
    """One queue argument. ``policy_key`` None: no policy sets it; ``declare_check`` None: the declare
    takes any value (or the queue type's own rules check it); ``field`` None: no QueueSettings field."""

    argument: str
    kinds: frozenset[str]
    declare_check: Check | None = None
    policy_key: str | None = None
    policy_check: Check | None = None
    precedence: str = OTHER
    field: str | None = None
    value: Callable[[Any], Any] = text_of  # a raw argument or policy value as the field holds it


ALL = frozenset({CLASSIC, QUORUM, STREAM})
CLASSIC_QUORUM = frozenset({CLASSIC, QUORUM})

# The declare checks run in this order (RabbitMQ's); unknown arguments are ignored, as there.
QUEUE_ARGUMENTS: tuple[QueueArgument, ...] = (
    QueueArgument("x-expires", CLASSIC_QUORUM, _expires_reason, "expires", int_at_least(1, "queue expiry"),
                  SMALLER, "expires", int_or_none),
    QueueArgument("x-message-ttl", CLASSIC_QUORUM, _ttl_reason, "message-ttl", int_at_least(0, "message TTL"),
                  SMALLER, "message_ttl", int_or_none),
    QueueArgument("x-dead-letter-exchange", CLASSIC_QUORUM, _short_string_reason, "dead-letter-exchange",
                  string_named("dead letter exchange name"), ARGUMENT_FIRST, "dead_letter_exchange"),
    QueueArgument("x-dead-letter-routing-key", CLASSIC_QUORUM, _short_string_reason, "dead-letter-routing-key",
                  string_named("dead letter routing key"), ARGUMENT_FIRST, "dead_letter_routing_key"),
    QueueArgument("x-max-length", CLASSIC_QUORUM, non_negative_int_reason, "max-length",
                  int_at_least(0, "maximum length"), SMALLER, "max_length", int_or_none),
    QueueArgument("x-max-length-bytes", ALL, non_negative_int_reason, "max-length-bytes",
                  int_at_least(0, "maximum length in bytes"), SMALLER, "max_length_bytes", int_or_none),
    QueueArgument("x-max-priority", frozenset({CLASSIC}), _max_priority_reason, precedence=ARGUMENT_ONLY,
                  field="max_priority", value=int_or_none),
    # a quorum queue: the policy's overflow wins (QueueSettings.resolve)
    QueueArgument("x-overflow", CLASSIC_QUORUM, _choice_reason(OVERFLOW_MODES, "invalid_overflow"), "overflow",
                  one_of(OVERFLOW_MODES, "overflow"), ARGUMENT_FIRST, "overflow"),
    QueueArgument("x-queue-mode", frozenset({CLASSIC}), _choice_reason(QUEUE_MODES, "invalid_queue_mode"),
                  "queue-mode", one_of(QUEUE_MODES, "queue-mode")),
    QueueArgument("x-single-active-consumer", CLASSIC_QUORUM, _bool_reason, precedence=ARGUMENT_ONLY,
                  field="single_active_consumer", value=_is_true),
    # a quorum queue: its own rule and default (arguments.quorum_delivery_limit)
    QueueArgument("x-delivery-limit", CLASSIC_QUORUM, _delivery_limit_reason, "delivery-limit",
                  int_at_least(-1, "delivery limit"), SMALLER, "delivery_limit", int_or_none),
    QueueArgument("x-consumer-timeout", CLASSIC_QUORUM, non_negative_int_reason, "consumer-timeout",
                  int_at_least(0, "consumer timeout"), SMALLER, "consumer_timeout", int_or_none),
    QueueArgument("x-max-age", frozenset({STREAM}), _max_age_reason, "max-age", _policy_max_age, SMALLER,
                  "max_age", age_or_none),
    QueueArgument("x-stream-max-segment-size-bytes", frozenset({STREAM}), non_negative_int_reason,
                  "stream-max-segment-size-bytes", int_at_least(0, "segment size"), ARGUMENT_FIRST,
                  "stream_max_segment_size_bytes", int_or_none),
    # checked by the queue type's own rules (quorum_arguments, queues.stream_arguments) or accepted
    QueueArgument("x-queue-type", ALL),
    QueueArgument("x-dead-letter-strategy", frozenset({QUORUM}), policy_key="dead-letter-strategy",
                  policy_check=one_of(DEAD_LETTER_STRATEGIES, "dead-letter-strategy")),
    QueueArgument("x-queue-version", frozenset({CLASSIC}), policy_key="queue-version", policy_check=_queue_version),
    QueueArgument("x-queue-master-locator", frozenset({CLASSIC})),
    QueueArgument("x-max-in-memory-length", frozenset({QUORUM})),
    QueueArgument("x-max-in-memory-bytes", frozenset({QUORUM})),
    QueueArgument("x-quorum-initial-group-size", frozenset({QUORUM})),
    QueueArgument("x-member-placement-tag", frozenset({QUORUM})),
    QueueArgument("x-queue-leader-locator", frozenset({QUORUM, STREAM})),
    QueueArgument("x-initial-cluster-size", frozenset({STREAM})),
    QueueArgument("x-stream-filter-size-bytes", frozenset({STREAM})),
)

DECLARE_CHECKS: tuple[tuple[str, Check], ...] = tuple(
    (row.argument, row.declare_check) for row in QUEUE_ARGUMENTS if row.declare_check is not None)
POLICY_CHECKS: dict[str, Check] = {
    row.policy_key: row.policy_check for row in QUEUE_ARGUMENTS
    if row.policy_key is not None and row.policy_check is not None}
SETTINGS_ROWS: tuple[QueueArgument, ...] = tuple(row for row in QUEUE_ARGUMENTS if row.field is not None)


def arguments_of(kind: str) -> frozenset[str]:
    """The declare arguments a queue type takes."""
    return frozenset(row.argument for row in QUEUE_ARGUMENTS if kind in row.kinds)


def arguments_not_of(kind: str) -> frozenset[str]:
    """The arguments only other queue types take (a quorum queue refuses them by name)."""
    return frozenset(row.argument for row in QUEUE_ARGUMENTS if kind not in row.kinds)
