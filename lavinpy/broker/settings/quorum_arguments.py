"""Quorum queue declarations: the flags and arguments RabbitMQ 4 accepts for ``x-queue-type: quorum``.

A quorum queue here is a durable queue with the classic queue's storage and features (the cluster's
in-sync replicas hold its messages, not a Raft group per queue), so only the declaration rules and
the defaults differ. RabbitMQ checks a declaration in this order, and so does this module: the value
of each argument the quorum type knows, then any argument only another type knows ("invalid arg
'x-max-priority' for queue 'q' in vhost '/' of queue type rabbit_quorum_queue"), then the flags
(auto-delete, exclusive, non-durable).
"""

from __future__ import annotations

from typing import Any

from ..errors import PRECONDITION_FAILED, BrokerChannelError
from .arguments import ArgumentError, amqp_type_name, validate_queue_arguments
from .queue_arguments import QUORUM, arguments_not_of, arguments_of

TYPE_MODULE = "rabbit_quorum_queue"  # RabbitMQ names the type by its module in these texts
DEAD_LETTER_STRATEGIES = ("at-most-once", "at-least-once")
_QUEUE_DECLARE = (50, 10)

# Arguments RabbitMQ's quorum type takes (its capabilities list; the table's kinds). The cluster ones
# (group size, leader locator, placement tag) are accepted and reported: every in-sync replica holds the
# queue.
QUORUM_ARGUMENTS = arguments_of(QUORUM)
# Arguments of the other types (classic, stream) a quorum queue refuses by name, as RabbitMQ does.
OTHER_TYPES_ARGUMENTS = arguments_not_of(QUORUM)
LEADER_LOCATORS = ("client-local", "balanced")


def _where(name: str, vhost: str) -> str:
    return f"queue '{name}' in vhost '{vhost}'"


def _refuse(text: str) -> BrokerChannelError:
    return BrokerChannelError(PRECONDITION_FAILED, text, *_QUEUE_DECLARE)


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return value if isinstance(value, str) else None


def _group_size_reason(value: Any) -> str | None:
    if not isinstance(value, int) or isinstance(value, bool):
        return f"{{unacceptable_type,{amqp_type_name(value)}}}"
    if value < 0:
        return f"{{value_negative,{value}}}"
    return f"{{value_zero,{value}}}" if value == 0 else None


def _choice_reason(value: Any, choices: tuple[str, ...], error: str) -> str | None:
    text = _text(value)
    if text is None:
        return f"{{unacceptable_type,{amqp_type_name(value)}}}"
    return None if text in choices else error


def validate_quorum_declare(name: str, vhost: str, *, durable: bool, exclusive: bool, auto_delete: bool,
                            arguments: dict[str, Any], server_named: bool = False) -> None:
    """Refuse a quorum queue declaration the way RabbitMQ 4 does (406 PRECONDITION_FAILED)."""
    if server_named:
        raise _refuse(f"Cannot declare a server-named queue for type {TYPE_MODULE}")
    where = _where(name, vhost)
    known = {key: value for key, value in arguments.items() if key not in OTHER_TYPES_ARGUMENTS}
    try:
        validate_queue_arguments(known, queue=name, vhost=vhost)
    except ArgumentError as e:
        raise _refuse(e.text) from None
    for key, reason in (
        ("x-dead-letter-strategy", lambda v: _choice_reason(v, DEAD_LETTER_STRATEGIES, "invalid_dlx_strategy")),
        ("x-quorum-initial-group-size", _group_size_reason),
        ("x-queue-leader-locator", lambda v: _choice_reason(v, LEADER_LOCATORS, "invalid_queue_locator_arg")),
    ):
        if key in arguments:
            problem = reason(arguments[key])
            if problem is not None:
                raise _refuse(f"invalid arg '{key}' for {where}: {problem}")
    for key in arguments:  # in the client's order, as RabbitMQ walks the table
        if key in OTHER_TYPES_ARGUMENTS:
            raise _refuse(f"invalid arg '{key}' for {where} of queue type {TYPE_MODULE}")
    for prop, bad in (("auto-delete", auto_delete), ("exclusive-owner", exclusive), ("non-durable", not durable)):
        if bad:
            raise _refuse(f"invalid property '{prop}' for {where}")

