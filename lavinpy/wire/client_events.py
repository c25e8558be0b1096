"""What ``ClientConnection.receive_data`` reports: one small value per thing the broker did.

Slotted dataclasses, and not frozen ones: a frozen one's __init__ sets each field through
object.__setattr__, and deliveries and confirms are made once per message on the shovel's path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "Blocked",
    "ChannelClosed",
    "ChannelFlow",
    "ConnectionClosed",
    "ConnectionOpened",
    "ConsumerCancelled",
    "Confirmed",
    "Delivery",
    "Event",
    "MethodReceived",
    "Reply",
    "Returned",
    "Unblocked",
]


@dataclass(slots=True)
class ConnectionOpened:
    """connection.open-ok: the handshake is done with these negotiated limits."""
    server_properties: dict[str, Any]
    channel_max: int
    frame_max: int
    heartbeat: int


@dataclass(slots=True)
class ConnectionClosed:
    """The connection is over: the broker closed it (``by_broker``) or answered our close."""
    reply_code: int
    reply_text: str
    class_id: int
    method_id: int
    by_broker: bool


@dataclass(slots=True)
class Reply:
    """The reply to a ``call`` on ``channel`` (replies come in the order the calls went out).
    A basic.get-ok carries its message's property block and body."""
    channel: int
    method: Any
    properties: bytes = b""
    body: bytes = b""


@dataclass(slots=True)
class ChannelClosed:
    """The broker closed ``channel`` (already answered with close-ok); its pending calls are void."""
    channel: int
    reply_code: int
    reply_text: str
    class_id: int
    method_id: int


@dataclass(slots=True)
class Delivery:
    """basic.deliver with its content; ``properties`` is the raw property block (decode it lazily)."""
    channel: int
    consumer_tag: str
    delivery_tag: int
    redelivered: bool
    exchange: str
    routing_key: str
    properties: bytes
    body: bytes


@dataclass(slots=True)
class Returned:
    """basic.return (an unroutable mandatory publish) with its content."""
    channel: int
    reply_code: int
    reply_text: str
    exchange: str
    routing_key: str
    properties: bytes
    body: bytes


@dataclass(slots=True)
class Confirmed:
    """A publisher confirm: basic.ack (``nack`` False) or basic.nack, for ``delivery_tag`` alone or,
    with ``multiple``, every unconfirmed tag up to it."""
    channel: int
    delivery_tag: int
    multiple: bool
    nack: bool


@dataclass(slots=True)
class ChannelFlow:
    """channel.flow from the broker (already answered with flow-ok): publish on ``channel`` or not."""
    channel: int
    active: bool


@dataclass(slots=True)
class Blocked:
    """connection.blocked: the broker reads no publishes until ``Unblocked`` (a resource alarm)."""
    reason: str


@dataclass(slots=True)
class Unblocked:
    """connection.unblocked."""


@dataclass(slots=True)
class ConsumerCancelled:
    """basic.cancel from the broker: the consumer's queue went away."""
    channel: int
    consumer_tag: str


@dataclass(slots=True)
class MethodReceived:
    """Any other method (one nobody called for), decoded by pamqp."""
    channel: int
    method: Any


Event = (ConnectionOpened | ConnectionClosed | Reply | ChannelClosed | Delivery | Returned | Confirmed
         | ChannelFlow | Blocked | Unblocked | ConsumerCancelled | MethodReceived)
