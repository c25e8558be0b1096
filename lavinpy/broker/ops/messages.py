"""Publish, get, peek and replay, with their permission checks (RabbitMQ's rules and texts)."""

from __future__ import annotations

import base64
import binascii
import datetime
import struct
from typing import TYPE_CHECKING, Any

from pamqp import commands
from pamqp.exceptions import PAMQPException

from ...store.record import StoredMessage
from ...wire.field_table import FieldTableError, check_nesting
from ...wire.properties import decode_properties, encode_properties, peek_headers
from ..access.actor import Actor
from ..errors import ACCESS_REFUSED, NOT_FOUND, PRECONDITION_FAILED, BrokerChannelError
from ..metrics.stats import AMQP_091
from ..queues.stream import StreamQueue
from ..settings.arguments import ArgumentError, parse_expiration
from ..settings.names import check_name_length
from .deliveries import get_one
from .object_info import jsonable
from .objects import readable_queue
from .publish import publish

if TYPE_CHECKING:
    from ..access.permissions import TopicCheck
    from ..exchanges.base import Exchange
    from ..vhost import VHost


def publish_exchange(actor: Actor | None, vhost: VHost, name: str) -> Exchange:
    """The exchange a publish goes to: write permission, exists (404), not internal (403).

    AMQP channels keep the answer for their next publishes to the same name until the vhost's
    generation changes (an exchange deleted, a user's permissions changed), so this runs once per
    (channel, exchange), not per message.
    """
    if actor is not None:
        actor.check("write", "exchange", name, vhost.name)
    exchange = vhost.get_exchange(name)
    if exchange.internal:
        raise BrokerChannelError(ACCESS_REFUSED, f"cannot publish to internal exchange '{name}' "
                                               f"in vhost '{vhost.name}'", 60, 40)
    return exchange


def publish_topic_check(actor: Actor | None, vhost: VHost, exchange: Exchange) -> TopicCheck | None:
    """The topic permission check the routing keys of publishes to ``exchange`` need (RabbitMQ's 403
    "write access to topic ..."), or None when none applies: a channel keeps it with the exchange, so a
    user without topic permissions pays nothing per message."""
    if actor is None or exchange.type != "topic":
        return None
    return actor.topic_check("write", vhost.name, exchange.name, exchange.type)


# --- messages as the management API shows them -----------------------------------------------------

ACK_MODES = ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true", "reject_requeue_false")
PAYLOAD_ENCODINGS = ("auto", "base64")
# RabbitMQ's JSON property names -> pamqp's attribute names.
PROPERTY_NAMES = {"content_type": "content_type", "content_encoding": "content_encoding", "headers": "headers",
                  "delivery_mode": "delivery_mode", "priority": "priority", "correlation_id": "correlation_id",
                  "reply_to": "reply_to", "expiration": "expiration", "message_id": "message_id",
                  "timestamp": "timestamp", "type": "message_type", "user_id": "user_id", "app_id": "app_id",
                  "cluster_id": "cluster_id"}


def bad_input(text: str) -> BrokerChannelError:
    return BrokerChannelError(PRECONDITION_FAILED, text)


def properties_to_json(raw: bytes) -> dict[str, Any]:
    props = decode_properties(raw)
    out: dict[str, Any] = {}
    for json_name, attr in PROPERTY_NAMES.items():
        value = getattr(props, attr, None)
        if value is not None:
            out[json_name] = jsonable(value)
    return out


def properties_from_json(properties: Any) -> bytes:
    """Basic properties from the API's JSON object (RabbitMQ's names); a bad one is a 400 naming it."""
    if not isinstance(properties, dict):
        raise bad_input("properties must be a JSON object")
    kwargs: dict[str, Any] = {}
    for name, value in properties.items():
        attr = PROPERTY_NAMES.get(name)
        if attr is None:
            raise bad_input(f"unknown message property '{name}'")
        if name == "timestamp" and isinstance(value, int):
            try:
                value = datetime.datetime.fromtimestamp(value, datetime.UTC)
            except (OverflowError, OSError, ValueError):
                raise bad_input(f"timestamp {value} is out of range") from None
        if name == "headers":
            try:
                check_nesting(value)
            except FieldTableError as e:
                raise bad_input(f"invalid message properties: headers: {e}") from None
        if name == "priority" and (not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 255):
            raise bad_input(f"priority must be an integer from 0 to 255, not {value!r}")
        kwargs[attr] = value
    try:
        return encode_properties(commands.Basic.Properties(**kwargs))
    except (TypeError, ValueError, AttributeError, PAMQPException) as e:
        raise bad_input(f"invalid message properties: {e}") from None
    except (struct.error, OverflowError):  # a number too large for its field, e.g. priority 256
        raise bad_input("invalid message properties: a number is out of its field's range") from None


def payload_bytes(payload: Any, encoding: Any) -> bytes:
    if not isinstance(payload, str):
        raise bad_input("payload must be a string")
    if encoding == "string":
        return payload.encode("utf-8", "surrogateescape")
    if encoding == "base64":
        try:
            return base64.b64decode(payload, validate=True)
        except binascii.Error:
            raise bad_input("payload is not valid base64") from None
    raise bad_input(f"payload_encoding must be 'string' or 'base64', not {encoding!r}")


def message_to_json(msg: StoredMessage, redelivered: bool, message_count: int, encoding: str,
                    truncate: int | None) -> dict[str, Any]:
    body = bytes(msg.body)
    shown = body[:truncate] if truncate is not None else body
    payload_encoding = "string"
    try:
        if encoding == "base64":
            raise UnicodeDecodeError("utf-8", b"", 0, 1, "base64 asked for")
        payload = shown.decode("utf-8")
    except UnicodeDecodeError:
        payload, payload_encoding = base64.b64encode(shown).decode(), "base64"
    return {"payload_bytes": len(body), "redelivered": redelivered, "exchange": msg.exchange,
            "routing_key": msg.routing_key, "message_count": message_count,
            "properties": properties_to_json(msg.properties), "payload": payload,
            "payload_encoding": payload_encoding}


# --- publish, get, peek, replay ------------------------------------------------------------------

def publish_message(actor: Actor | None, vhost: VHost, exchange_name: str, routing_key: str, properties: bytes,
                    body: bytes) -> bool:
    """Publish one message as a client would; returns whether any queue took it."""
    check_name_length("routing key", routing_key)
    exchange = publish_exchange(actor, vhost, exchange_name)
    check = publish_topic_check(actor, vhost, exchange)
    if check is not None:
        check(routing_key)
    max_size = vhost.config.max_message_size
    if len(body) > max_size:
        raise bad_input(f"message size {len(body)} is larger than max size {max_size}")
    props = decode_properties(properties)
    if props.user_id is not None and actor is not None and props.user_id != actor.name:
        raise bad_input(f"user_id property set to '{props.user_id}' but authenticated user was '{actor.name}'")
    if props.expiration is not None:
        try:
            parse_expiration(props.expiration)
        except ArgumentError as e:
            raise bad_input(e.text) from None
    routed, _ = publish(vhost, exchange, routing_key, False, properties, body, vhost.node_counters.of(AMQP_091))
    return routed


def get_messages(actor: Actor | None, vhost: VHost, queue_name: str, *, count: int, ackmode: str,
                 encoding: str = "auto", truncate: int | None = None) -> list[dict[str, Any]]:
    """Take up to ``count`` messages and settle them as ``ackmode`` says (RabbitMQ's get semantics:
    requeued ones go back only after all were taken, so none is returned twice)."""
    if ackmode not in ACK_MODES:
        raise bad_input(f"ackmode must be one of {', '.join(ACK_MODES)}, not {ackmode!r}")
    if encoding not in PAYLOAD_ENCODINGS:
        raise bad_input(f"encoding must be 'auto' or 'base64', not {encoding!r}")
    if not isinstance(count, int) or count < 1:
        raise bad_input(f"count must be a positive integer, not {count!r}")
    if truncate is not None and (not isinstance(truncate, int) or truncate < 0):
        raise bad_input(f"truncate must be a non-negative integer, not {truncate!r}")
    queue = readable_queue(actor, vhost, queue_name, None)
    counters = vhost.node_counters.of(AMQP_091)  # as RabbitMQ's management plugin's internal AMQP 0-9-1 get
    taken: list[int] = []
    out: list[dict[str, Any]] = []
    try:
        for _ in range(count):
            got = get_one(queue, False, counters)
            if got is None:
                break
            pos, msg, redelivered = got
            taken.append(pos)
            out.append(message_to_json(msg, redelivered, queue.message_count, encoding, truncate))
    finally:
        for pos in taken:
            if ackmode.endswith("requeue_true"):
                queue.requeue(pos)
            elif ackmode == "ack_requeue_false":
                queue.ack(pos)
            else:
                queue.reject(pos)  # dead-lettered (reason rejected) when the queue has a DLX
    return out


def peek_messages(actor: Actor | None, vhost: VHost, queue_name: str, count: int) -> list[dict[str, Any]]:
    """The first ``count`` messages from the head (a stream's oldest), read without taking, settling or
    marking them."""
    if count < 1:
        raise bad_input(f"count must be a positive integer, not {count}")
    queue = readable_queue(actor, vhost, queue_name, None)
    remaining = queue.message_count
    out = [message_to_json(msg, redelivered, remaining, "auto", None) for msg, redelivered in queue.peek(count)]
    if len(out) < count and queue.delayed_count:
        # then the messages held for a delayed retry, earliest first, each with its due time
        for msg, due in queue.peek_delayed(count - len(out)):
            out.append({**message_to_json(msg, True, remaining, "auto", None), "delayed_until": due})
    return out


def _first_death(properties: bytes) -> tuple[str, str] | None:
    """(exchange, routing key) of the first x-death entry, or None when there is none usable."""
    headers = peek_headers(properties)
    deaths = headers.get("x-death") if headers else None
    if not isinstance(deaths, list) or not deaths or not isinstance(deaths[0], dict):
        return None
    entry = deaths[0]
    exchange, keys = entry.get("exchange"), entry.get("routing-keys")
    if isinstance(exchange, bytes):
        exchange = exchange.decode("utf-8", "surrogateescape")
    if not isinstance(exchange, str) or not isinstance(keys, list) or not keys:
        return None
    key = keys[0].decode("utf-8", "surrogateescape") if isinstance(keys[0], bytes) else keys[0]
    return (exchange, key) if isinstance(key, str) else None


def replay_messages(actor: Actor | None, vhost: VHost, queue_name: str, count: int) -> dict[str, int]:
    """Republish up to ``count`` dead-lettered messages from the head of a queue to the exchange and
    routing key of their first x-death entry. A message leaves the queue only once it was routed;
    one without x-death, whose exchange is gone or that no queue takes stays, in its place.
    Needs read on the queue and write on each target exchange (checked before any message moves)."""
    if not isinstance(count, int) or count < 1:
        raise bad_input(f"count must be a positive integer, not {count!r}")
    queue = readable_queue(actor, vhost, queue_name, None)
    taken: list[tuple[int, StoredMessage]] = []
    for _ in range(count):
        got = queue.get()
        if got is None:
            break
        taken.append((got[0], got[1]))
    replayed = 0
    try:
        targets = [_first_death(msg.properties) for _, msg in taken]
        for exchange_name, _key in {t for t in targets if t is not None}:
            if actor is not None:
                actor.check("write", "exchange", exchange_name, vhost.name)
        for i, ((pos, msg), target) in enumerate(zip(taken, targets, strict=True)):
            exchange = vhost.exchanges.get(target[0]) if target is not None else None
            if exchange is None or target is None:
                continue
            queued, _ = vhost.publish(exchange, target[1], msg.properties, bytes(msg.body))
            if queued:
                queue.ack(pos)
                taken[i] = (-1, msg)
                replayed += 1
    finally:
        for pos, _ in taken:
            if pos != -1:
                queue.requeue(pos)
    return {"replayed": replayed, "left": len(taken) - replayed}


# --- tracked stream offsets -------------------------------------------------------------------------

def _stream(actor: Actor | None, vhost: VHost, queue_name: str) -> StreamQueue:
    queue = readable_queue(actor, vhost, queue_name, None)
    if not isinstance(queue, StreamQueue):
        raise bad_input(f"queue '{queue_name}' in vhost '{vhost.name}' is not a stream: only streams track "
                        "consumer offsets")
    return queue


def stream_consumer_offsets(actor: Actor | None, vhost: VHost, queue_name: str) -> list[dict[str, Any]]:
    """The offsets a stream keeps per consumer tag (read permission on the queue). A look takes nothing,
    so an exclusive queue answers too, and a queue of another kind keeps none: an empty list."""
    if actor is not None:
        actor.check("read", "queue", queue_name, vhost.name)
    queue = vhost.get_queue(queue_name)
    return queue.offsets.rows() if isinstance(queue, StreamQueue) else []


def delete_stream_consumer_offset(actor: Actor | None, vhost: VHost, queue_name: str, tag: str) -> None:
    """Forget a consumer tag's offset: its next consumer starts where its arguments say. Refused while
    a consumer with that tag is attached (it would store its offset again at its next ack)."""
    offsets = _stream(actor, vhost, queue_name).offsets
    if offsets.attached(tag):
        raise bad_input(f"consumer tag '{tag}' is consuming from queue '{queue_name}' in vhost '{vhost.name}'; "
                        "cancel it first")
    if not offsets.forget(tag):
        raise BrokerChannelError(NOT_FOUND, f"no offset for consumer tag '{tag}' in queue '{queue_name}' in vhost "
                                            f"'{vhost.name}'")
