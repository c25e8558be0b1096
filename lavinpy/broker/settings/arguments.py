"""Queue, consumer and message arguments: validation as RabbitMQ does it, and the effective settings.

Validation follows RabbitMQ's rules and error texts ("invalid arg 'x-max-length' for queue 'q' in vhost
'/': {value_negative,-1}"), so clients and tests written against RabbitMQ see the same reply. The
reason term is printed the way Erlang prints it, because that is what RabbitMQ users search for.

The checks, their order and the precedence of each argument come from the one table of queue arguments
(``queue_arguments.QUEUE_ARGUMENTS``). ``QueueSettings.resolve`` combines declare arguments with the
definition of the matching policy by its precedence column: for the numeric limits (message-ttl, expires,
max-length, max-length-bytes, delivery-limit, consumer-timeout, max-age) the smaller value wins; for
everything else the argument wins over the policy; a quorum queue's own rules are applied after.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import deduplication, retries
from .names import name_too_long
from .queue_arguments import (
    DECLARE_CHECKS,
    SETTINGS_ROWS,
    SMALLER,
    expiry_reason,
    int_or_none,
    int_reason,
    non_negative_int_reason,
    term,
    text_of,
)
from .queue_arguments import MAX_EXPIRY as MAX_EXPIRY
from .queue_arguments import OVERFLOW_MODES as OVERFLOW_MODES
from .queue_arguments import QUEUE_MODES as QUEUE_MODES
from .queue_arguments import amqp_type_name as amqp_type_name
from .queue_arguments import parse_max_age as parse_max_age
from .refused_arguments import refusal_text, refused_argument

QUEUE_TYPES = ("classic", "quorum", "stream")
DEFAULT_DELIVERY_LIMIT = 20  # RabbitMQ 4: a quorum queue without a delivery limit gets this one
DEAD_LETTER_REASONS = ("rejected", "expired", "maxlen", "delivery_limit")
_LEADING_INT = re.compile(r"[+-]?[0-9]+")
QUORUM_MAX_PRIORITY = 31  # RabbitMQ 4.3's quorum queues: strict priorities 0-31 ...
QUORUM_DEFAULT_PRIORITY = 4  # ... a message without one counting as 4


class ArgumentError(ValueError):
    """An argument has a bad type or value; ``text`` is the reply text after "PRECONDITION_FAILED - "."""

    def __init__(self, name: str, text: str) -> None:
        self.name = name
        self.text = text
        super().__init__(text)


def _resource(kind: str, name: str, vhost: str) -> str:
    return f"{kind} '{name}' in vhost '{vhost}'"


# Declare arguments in the order RabbitMQ checks them (the table in queue_arguments); unknown arguments
# are ignored, as there.
_QUEUE_CHECKS = DECLARE_CHECKS


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
    text = text_of(arguments.get("alternate-exchange"))
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
    text = text_of(value)
    return text if text is not None else repr(value)


# --- consumer arguments -----------------------------------------------------------------------------

def validate_consumer_arguments(arguments: Mapping[str, Any], *, queue: str, vhost: str) -> None:
    """Raise ArgumentError for a bad basic.consume argument (x-stream-offset: ``stream_arguments``)."""
    where = _resource("queue", queue, vhost)
    refused = refused_argument("consumer", arguments)
    if refused is not None:
        raise ArgumentError(refused.name, refusal_text(refused, where))
    for name, check in (("x-priority", int_reason), ("x-consumer-timeout", non_negative_int_reason)):
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
        reason = term("leftover_string", expiration[match.end():])
    else:
        value = int(match.group())
        reason = expiry_reason(value)
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
        values: dict[str, Any] = {}
        for row in SETTINGS_ROWS:  # the table's precedence column
            field = row.field or ""
            argument = arguments.get(row.argument)
            if row.policy_key is None:  # argument only
                values[field] = row.value(argument)
                continue
            from_policy = pol.get(row.policy_key)
            if row.precedence == SMALLER:
                values[field] = _min_of(row.value(argument), row.value(from_policy))
            else:  # the argument first
                chosen = argument if argument is not None else from_policy
                values[field] = row.value(chosen) if chosen is not None else None
        queue_type = queue_type_of(arguments)
        default_priority = 0
        if queue_type == "quorum":
            # RabbitMQ 4.3's quorum queue: strict priorities 0-31 always, 4 for a message without one.
            values["max_priority"], default_priority = QUORUM_MAX_PRIORITY, QUORUM_DEFAULT_PRIORITY
            values["delivery_limit"] = quorum_delivery_limit(int_or_none(arguments.get("x-delivery-limit")),
                                                             int_or_none(pol.get("delivery-limit")))
            # RabbitMQ's quorum queue: the policy's overflow wins, and reject-publish-dlx (a classic
            # queue mode) falls back to drop-head.
            overflow = text_of(pol.get("overflow")) or values["overflow"] or "drop-head"
            if overflow == "reject-publish-dlx":
                overflow = "drop-head"
        else:
            if values["delivery_limit"] is not None and values["delivery_limit"] < 0:
                values["delivery_limit"] = None
            overflow = values["overflow"] or "drop-head"
        values["overflow"] = overflow
        return cls(queue_type=queue_type, default_priority=default_priority, policy=policy_name,
                   retry=retries.resolve(arguments, pol) if queue_type != "stream" else None, **values)


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
    return text_of(value) if value is not None else None
