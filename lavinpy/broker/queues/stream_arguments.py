"""Stream arguments: what a stream declaration and a stream consumer may ask, as RabbitMQ checks it.

The retention age (``x-max-age``) and interval offsets are read by ``arguments.parse_max_age``, the
one parser of that syntax; the stream queue reads its limits from its ``QueueSettings``.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from typing import Any

from ..errors import NOT_IMPLEMENTED, PRECONDITION_FAILED, BrokerChannelError, BrokerConnectionError
from ..settings.arguments import amqp_type_name, parse_max_age
from ..settings.queue_arguments import STREAM, arguments_of
from .stream_filter import StreamFilterError, stream_filter
from .stream_offsets import OffsetTrackingError, tracking_requested

OFFSET_HEADER = "x-stream-offset"
# method ids for error replies
_BASIC_CONSUME = (60, 20)
_QUEUE_DECLARE = (50, 10)
# Arguments a stream accepts (RabbitMQ's list, minus clustering ones lavinpy ignores; the table's kinds).
STREAM_ARGUMENTS = arguments_of(STREAM)


def _int_between(low: int, high: int | None) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{{unacceptable_type,{amqp_type_name(value)}}}"
        if value < low or (high is not None and value > high):
            return f"{value} is not an integer from {low}" + (f" to {high}" if high is not None else " up")
        return None
    return check


def _leader_locator(value: Any) -> str | None:
    text = bytes(value).decode("utf-8", "replace") if isinstance(value, bytes | bytearray) else value
    return None if text in ("client-local", "balanced") else "invalid_queue_locator_arg"


# The declare arguments checked here (x-max-length-bytes and x-max-age below), as RabbitMQ's ranges:
# a filter size from 16 to 255 bytes, a cluster size of at least one node.
_DECLARE_CHECKS: tuple[tuple[str, Callable[[Any], str | None]], ...] = (
    ("x-stream-max-segment-size-bytes", _int_between(1, None)),
    ("x-initial-cluster-size", _int_between(1, None)),
    ("x-queue-leader-locator", _leader_locator),
    ("x-stream-filter-size-bytes", _int_between(16, 255)),
)


def queue_in_vhost(queue: str, vhost: str) -> str:
    return f"queue '{queue}' in vhost '{vhost}'"


def validate_stream_declare(name: str, vhost: str, *, durable: bool, exclusive: bool, auto_delete: bool,
                            arguments: dict[str, Any]) -> None:
    """Refuse a stream declaration that RabbitMQ refuses (406 PRECONDITION_FAILED)."""
    where = queue_in_vhost(name, vhost)
    for prop, bad in (("non-durable", not durable), ("exclusive-owner", exclusive),
                      ("auto-delete", auto_delete)):
        if bad:
            raise BrokerChannelError(PRECONDITION_FAILED, f"invalid property '{prop}' for {where}", *_QUEUE_DECLARE)
    for key in sorted(arguments):
        if key.startswith("x-") and key not in STREAM_ARGUMENTS:
            raise BrokerChannelError(PRECONDITION_FAILED,
                                     f"invalid arg '{key}' for {where} of queue type stream", *_QUEUE_DECLARE)
    max_bytes = arguments.get("x-max-length-bytes")
    if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0):
        raise BrokerChannelError(PRECONDITION_FAILED, f"invalid arg 'x-max-length-bytes' for {where}: "
                                                    f"{max_bytes!r} is not a non-negative integer", *_QUEUE_DECLARE)
    for key, check in _DECLARE_CHECKS:
        if key in arguments:
            problem = check(arguments[key])
            if problem is not None:
                raise BrokerChannelError(PRECONDITION_FAILED, f"invalid arg '{key}' for {where}: {problem}",
                                         *_QUEUE_DECLARE)
    if "x-max-age" in arguments:
        try:
            parse_max_age(arguments["x-max-age"])
        except ValueError as e:
            raise BrokerChannelError(PRECONDITION_FAILED, f"invalid arg 'x-max-age' for {where}: {e}",
                                     *_QUEUE_DECLARE) from None


def parse_stream_offset(value: Any, *, now_ms: int | None = None) -> tuple[str, int]:
    """An ``x-stream-offset`` argument as (kind, value); kind is first, last, next, offset, from_end
    (a negative offset: that many messages before the end) or timestamp.

    A timestamp (or an interval string, meaning that long ago) comes back in ms. ValueError if invalid.
    """
    if value is None:
        return "next", 0
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", "replace")
    if isinstance(value, str):
        if value in ("first", "last", "next"):
            return value, 0
        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        return "timestamp", now - parse_max_age(value)
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:  # pamqp decodes AMQP timestamps as UTC
            value = value.replace(tzinfo=datetime.UTC)
        return "timestamp", int(value.timestamp()) * 1000
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:  # LavinMQ's: that many before the end (-1 is the newest message)
            return "from_end", -value
        return "offset", value
    raise ValueError(f"{value!r} is not first, last, next, an offset, a timestamp or an interval")


def validate_stream_consumer(no_ack: bool, prefetch: int, arguments: dict[str, Any] | None, *,
                             queue: str = "", vhost: str = "/", global_prefetch: int = 0) -> None:
    """Refuse a basic.consume on a stream the way RabbitMQ does.

    No per-consumer prefetch: 406 (channel). no-ack, or a global prefetch: 540 NOT_IMPLEMENTED
    (a hard error: the connection closes). A malformed ``x-stream-offset``: 406.
    """
    where = queue_in_vhost(queue, vhost)
    if not prefetch:
        raise BrokerChannelError(PRECONDITION_FAILED, f"consumer prefetch count is not set for stream {where}",
                                 *_BASIC_CONSUME)
    if no_ack:
        raise BrokerConnectionError(NOT_IMPLEMENTED, f"automatic acknowledgement not supported by stream {where}",
                                    *_BASIC_CONSUME)
    if global_prefetch:
        raise BrokerConnectionError(NOT_IMPLEMENTED, f"{where} does not support global qos", *_BASIC_CONSUME)
    try:
        parse_stream_offset((arguments or {}).get(OFFSET_HEADER))
    except ValueError as e:
        raise BrokerChannelError(PRECONDITION_FAILED, f"invalid {OFFSET_HEADER} for {where}: {e}",
                                 *_BASIC_CONSUME) from None
    try:
        stream_filter(arguments)
        tracking_requested("", arguments)
    except (StreamFilterError, OffsetTrackingError) as e:
        raise BrokerChannelError(PRECONDITION_FAILED, str(e), *_BASIC_CONSUME) from None
