"""Queue, consumer and message arguments: validation as RabbitMQ does it, and the effective settings.

Validation follows RabbitMQ's rules and error texts ("invalid arg 'x-max-length' for queue 'q' in vhost
'/': {value_negative,-1}"), so clients and tests written against RabbitMQ see the same reply. The
reason term is printed the way Erlang prints it, because that is what RabbitMQ users search for.

``QueueSettings.resolve`` combines declare arguments with the definition of the matching policy using
RabbitMQ's precedence: for the numeric limits (message-ttl, expires, max-length, max-length-bytes,
delivery-limit, consumer-timeout, max-age) the smaller value wins; for everything else the argument
wins over the policy. Values arrive decoded by pamqp, so wire integer widths are not known here: any
int (but not a bool) counts as an AMQP integer type.
"""

from __future__ import annotations

import datetime
import decimal
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import deduplication, retries
from .names import name_too_long
from .refused_arguments import refusal_text, refused_argument

MAX_EXPIRY = 315_360_000_000  # RabbitMQ's TTL/expiry ceiling since 3.11 (ten years), in ms
MAX_PRIORITY = 255
OVERFLOW_MODES = ("drop-head", "reject-publish", "reject-publish-dlx")
QUEUE_MODES = ("default", "lazy")
QUEUE_TYPES = ("classic", "quorum", "stream")
DEFAULT_DELIVERY_LIMIT = 20  # RabbitMQ 4: a quorum queue without a delivery limit gets this one
DEAD_LETTER_REASONS = ("rejected", "expired", "maxlen", "delivery_limit")
_MAX_AGE = re.compile(r"([0-9]+)([YMDhms])")
_AGE_UNIT_MS = {"Y": 365 * 86_400_000, "M": 30 * 86_400_000, "D": 86_400_000, "h": 3_600_000, "m": 60_000,
                "s": 1000}
_LEADING_INT = re.compile(r"[+-]?[0-9]+")
QUORUM_MAX_PRIORITY = 31  # RabbitMQ 4.3's quorum queues: strict priorities 0-31 ...
QUORUM_DEFAULT_PRIORITY = 4  # ... a message without one counting as 4


class ArgumentError(ValueError):
    """An argument has a bad type or value; ``text`` is the reply text after "PRECONDITION_FAILED - "."""

    def __init__(self, name: str, text: str) -> None:
        self.name = name
        self.text = text
        super().__init__(text)


# --- Erlang-style reason terms ----------------------------------------------------------------------

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


def _term(tag: str, value: Any) -> str:
    """``{tag,value}`` as Erlang prints it (strings quoted, numbers bare)."""
    shown = f'"{value}"' if isinstance(value, str) else str(value)
    return f"{{{tag},{shown}}}"


def _bad_type(value: Any) -> str:
    """``{unacceptable_type,longstr}``: the type is an atom, printed bare."""
    return f"{{unacceptable_type,{amqp_type_name(value)}}}"


def _resource(kind: str, name: str, vhost: str) -> str:
    return f"{kind} '{name}' in vhost '{vhost}'"


# --- single-value checks (each returns the reason term, or None when the value is fine) ---------------

def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_reason(value: Any) -> str | None:
    return None if _is_int(value) else _bad_type(value)


def _non_neg_int_reason(value: Any) -> str | None:
    reason = _int_reason(value)
    if reason is None and value < 0:
        return _term("value_negative", value)
    return reason


def _expiry_reason(value: int) -> str | None:
    if value < 0:
        return _term("value_negative", value)
    if value > MAX_EXPIRY:
        return _term("value_too_large", value)
    return None


def _ttl_reason(value: Any) -> str | None:
    return _int_reason(value) or _expiry_reason(value)


def _expires_reason(value: Any) -> str | None:
    reason = _int_reason(value)
    if reason is None and value == 0:
        return _term("value_zero", value)
    return reason or _expiry_reason(value)


def _max_priority_reason(value: Any) -> str | None:
    reason = _non_neg_int_reason(value)
    if reason is None and value > MAX_PRIORITY:
        return _term("max_value_exceeded", value)
    return reason


def _delivery_limit_reason(value: Any) -> str | None:
    # -1 means "no limit" (RabbitMQ 4 quorum queues accept it); anything lower is an error.
    reason = _int_reason(value)
    if reason is None and value < -1:
        return _term("value_negative", value)
    return reason


def _text(value: Any) -> str | None:
    """A longstr argument as str (bytes must be UTF-8), or None when it is not a string."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None


def _string_reason(value: Any) -> str | None:
    return None if _text(value) is not None else _bad_type(value)


def _short_string_reason(value: Any) -> str | None:
    """A string that names an exchange or is a routing key: at most 255 bytes (AMQP's short string)."""
    text = _text(value)
    return _bad_type(value) if text is None else name_too_long("the value", text)


def _bool_reason(value: Any) -> str | None:
    return None if isinstance(value, bool) else _bad_type(value)


def _choice_reason(choices: tuple[str, ...], error: str):
    def check(value: Any) -> str | None:
        text = _text(value)
        if text is None:
            return _bad_type(value)
        return None if text in choices else error
    return check


def _max_age_reason(value: Any) -> str | None:
    text = _text(value)
    if text is None:
        return _bad_type(value)
    try:
        parse_max_age(text)
    except ValueError:
        return "invalid_max_age"
    return None


def parse_max_age(value: Any) -> int:
    """A stream retention age or interval ("7D", "12h", "30m", "10s", "1Y", "1M") in ms.

    The one parser of x-max-age, the max-age policy key and interval x-stream-offset values. As in
    RabbitMQ a month is 30 days and a year 365 days; the number must be positive. ValueError if invalid.
    """
    text = _text(value)
    if text is None:
        raise ValueError(f"expected a string such as '7D', not {value!r}")
    match = _MAX_AGE.fullmatch(text)
    if match is None or int(match.group(1)) <= 0:
        raise ValueError(f"invalid max age '{text}': a positive integer followed by Y, M, D, h, m or s")
    return int(match.group(1)) * _AGE_UNIT_MS[match.group(2)]


# Declare arguments in the order RabbitMQ checks them; unknown arguments are ignored, as there.
_QUEUE_CHECKS = (
    ("x-expires", _expires_reason),
    ("x-message-ttl", _ttl_reason),
    ("x-dead-letter-exchange", _short_string_reason),
    ("x-dead-letter-routing-key", _short_string_reason),
    ("x-max-length", _non_neg_int_reason),
    ("x-max-length-bytes", _non_neg_int_reason),
    ("x-max-priority", _max_priority_reason),
    ("x-overflow", _choice_reason(OVERFLOW_MODES, "invalid_overflow")),
    ("x-queue-mode", _choice_reason(QUEUE_MODES, "invalid_queue_mode")),
    ("x-single-active-consumer", _bool_reason),
    ("x-delivery-limit", _delivery_limit_reason),
    ("x-consumer-timeout", _non_neg_int_reason),
    ("x-max-age", _max_age_reason),
    ("x-stream-max-segment-size-bytes", _non_neg_int_reason),
)


def validate_queue_arguments(arguments: Mapping[str, Any], *, queue: str, vhost: str, durable: bool = True,
                             exclusive: bool = False, auto_delete: bool = False,
                             queue_types: tuple[str, ...] = QUEUE_TYPES) -> None:
    """Raise ArgumentError for the first bad queue.declare argument (or stream property)."""
    where = _resource("queue", queue, vhost)
    for name, check in _QUEUE_CHECKS:
        if name in arguments:
            reason = check(arguments[name])
            if reason is not None:
                raise ArgumentError(name, f"invalid arg '{name}' for {where}: {reason}")
    for problem in (retries.argument_problem(arguments), deduplication.argument_problem(arguments)):
        if problem is not None:
            name, reason = problem
            raise ArgumentError(name, f"invalid arg '{name}' for {where}: {reason}")
    if "x-dead-letter-routing-key" in arguments and "x-dead-letter-exchange" not in arguments:
        raise ArgumentError("x-dead-letter-routing-key", f"invalid arg 'x-dead-letter-routing-key' for {where}: "
                                                         "routing_key_but_no_dlx_defined")
    queue_type = queue_type_of(arguments)
    if queue_type not in queue_types:
        raise ArgumentError("x-queue-type", f"invalid arg 'x-queue-type' for {where}: "
                                            f"queue type '{queue_type}' is not supported")


def validate_exchange_arguments(arguments: Mapping[str, Any], where: str) -> None:
    """Raise ArgumentError when the alternate-exchange argument is a name longer than 255 bytes."""
    text = _text(arguments.get("alternate-exchange"))
    reason = name_too_long("the value", text) if text is not None else None
    if reason is not None:
        raise ArgumentError("alternate-exchange", f"invalid arg 'alternate-exchange' for {where}: {reason}")
    problem = deduplication.argument_problem(arguments)
    if problem is not None:
        name, reason = problem
        raise ArgumentError(name, f"invalid arg '{name}' for {where}: {reason}")


def queue_type_of(arguments: Mapping[str, Any]) -> str:
    """The x-queue-type argument as text ("classic" when absent)."""
    value = arguments.get("x-queue-type", "classic")
    text = _text(value)
    return text if text is not None else repr(value)


# --- consumer arguments -----------------------------------------------------------------------------

def validate_consumer_arguments(arguments: Mapping[str, Any], *, queue: str, vhost: str) -> None:
    """Raise ArgumentError for a bad basic.consume argument (x-stream-offset: ``stream_arguments``)."""
    where = _resource("queue", queue, vhost)
    refused = refused_argument("consumer", arguments)
    if refused is not None:
        raise ArgumentError(refused.name, refusal_text(refused, where))
    for name, check in (("x-priority", _int_reason), ("x-consumer-timeout", _non_neg_int_reason)):
        if name in arguments:
            reason = check(arguments[name])
            if reason is not None:
                raise ArgumentError(name, f"invalid arg '{name}' for {where}: {reason}")


# --- per-message expiration -------------------------------------------------------------------------

def parse_expiration(expiration: str) -> int:
    """The per-message TTL in ms from the ``expiration`` property; ArgumentError when it is not one.

    RabbitMQ reads a leading integer and refuses leftovers, negative values and values over ten years.
    """
    match = _LEADING_INT.match(expiration)
    reason: str | None
    if match is None:
        reason = "no_integer"
    elif match.end() != len(expiration):
        reason = _term("leftover_string", expiration[match.end():])
    else:
        value = int(match.group())
        reason = _expiry_reason(value)
        if reason is None:
            return value
    raise ArgumentError("expiration", f"invalid expiration '{expiration}': {reason}")


# --- effective settings -----------------------------------------------------------------------------

def _min_of(argument: int | None, policy: int | None) -> int | None:
    if argument is None:
        return policy
    if policy is None:
        return argument
    return min(argument, policy)


def _int_or_none(value: Any) -> int | None:
    return value if _is_int(value) else None


def _age_or_none(value: Any) -> int | None:
    try:
        return parse_max_age(value)
    except ValueError:
        return None


@dataclass(frozen=True)
class QueueSettings:
    """What a queue enforces, from its arguments and its policy. Times (max_age too) are ms."""

    queue_type: str = "classic"
    message_ttl: int | None = None
    expires: int | None = None
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: str = "drop-head"
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    delivery_limit: int | None = None
    max_priority: int | None = None
    default_priority: int = 0  # the level of a message without a priority
    single_active_consumer: bool = False
    consumer_timeout: int | None = None
    max_age: int | None = None
    stream_max_segment_size_bytes: int | None = None
    retry: retries.RetryPolicy | None = None  # delayed retries (x-delayed-retry-*)
    policy: str | None = None

    @classmethod
    def resolve(cls, arguments: Mapping[str, Any], policy: Mapping[str, Any] | None = None,
                policy_name: str | None = None) -> QueueSettings:
        """Combine validated declare arguments with a policy definition (RabbitMQ's precedence).

        Only the argument can set x-max-priority, x-single-active-consumer and x-queue-type: they
        choose how the queue is built when it is declared.
        """
        pol = policy or {}

        def smaller(name: str) -> int | None:
            return _min_of(_int_or_none(arguments.get("x-" + name)), _int_or_none(pol.get(name)))

        def argument_first(name: str) -> Any:
            value = arguments.get("x-" + name)
            if value is None:
                value = pol.get(name)
            return _text(value) if value is not None else None

        queue_type = queue_type_of(arguments)
        max_priority = _int_or_none(arguments.get("x-max-priority"))
        default_priority = 0
        if queue_type == "quorum":
            # RabbitMQ 4.3's quorum queue: strict priorities 0-31 always, 4 for a message without one.
            max_priority, default_priority = QUORUM_MAX_PRIORITY, QUORUM_DEFAULT_PRIORITY
            delivery_limit = quorum_delivery_limit(_int_or_none(arguments.get("x-delivery-limit")),
                                                   _int_or_none(pol.get("delivery-limit")))
            # RabbitMQ's quorum queue: the policy's overflow wins, and reject-publish-dlx (a classic
            # queue mode) falls back to drop-head.
            overflow = _text(pol.get("overflow")) or argument_first("overflow") or "drop-head"
            if overflow == "reject-publish-dlx":
                overflow = "drop-head"
        else:
            delivery_limit = smaller("delivery-limit")
            if delivery_limit is not None and delivery_limit < 0:
                delivery_limit = None
            overflow = argument_first("overflow") or "drop-head"
        max_age = _min_of(_age_or_none(arguments.get("x-max-age")), _age_or_none(pol.get("max-age")))
        return cls(
            queue_type=queue_type,
            message_ttl=smaller("message-ttl"),
            expires=smaller("expires"),
            max_length=smaller("max-length"),
            max_length_bytes=smaller("max-length-bytes"),
            overflow=overflow,
            dead_letter_exchange=argument_first("dead-letter-exchange"),
            dead_letter_routing_key=argument_first("dead-letter-routing-key"),
            delivery_limit=delivery_limit,
            max_priority=max_priority,
            default_priority=default_priority,
            single_active_consumer=arguments.get("x-single-active-consumer") is True,
            consumer_timeout=smaller("consumer-timeout"),
            max_age=max_age,
            stream_max_segment_size_bytes=_int_or_none(arguments.get("x-stream-max-segment-size-bytes",
                                                                     pol.get("stream-max-segment-size-bytes"))),
            retry=retries.resolve(arguments, pol) if queue_type != "stream" else None,
            policy=policy_name,
        )


def quorum_delivery_limit(argument: int | None, policy: int | None) -> int | None:
    """The delivery limit RabbitMQ 4 gives a quorum queue; None means unlimited.

    Argument and policy: a negative one (unlimited) yields to the other (the larger wins), else the
    smaller wins; neither set: the default of 20. A negative result is no limit.
    """
    if argument is None and policy is None:
        return DEFAULT_DELIVERY_LIMIT
    if argument is None or policy is None:
        limit = argument if policy is None else policy
    elif argument < 0 or policy < 0:
        limit = max(argument, policy)
    else:
        limit = min(argument, policy)
    assert limit is not None
    return None if limit < 0 else limit


def alternate_exchange(arguments: Mapping[str, Any], policy: Mapping[str, Any] | None = None) -> str | None:
    """An exchange's alternate exchange: the argument wins over the policy, as in RabbitMQ."""
    value = arguments.get("alternate-exchange")
    if value is None and policy:
        value = policy.get("alternate-exchange")
    return _text(value) if value is not None else None
