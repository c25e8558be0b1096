"""What a channel needs of its connection (the AMQP connection implements it).

The channel modules name only this Protocol, never the connection's class: the connection knows its
channels, a channel knows its host through these members alone.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..broker.ops import Actor, VHost
    from ..config import Config
    from .spool import BodySpool


class ReplyTarget(Protocol):
    """A channel consuming from direct reply-to, as a publisher's channel reaches it."""

    closing: bool

    def deliver_reply(self, routing_key: str, properties: bytes, body: bytes) -> None: ...


class ReplyRegistry(Protocol):
    """The node's direct reply-to keys, shared by all connections."""

    @property
    def reply_to(self) -> MutableMapping[str, Any]:  # key -> ReplyTarget (a channel)
        ...


class ChannelHost(Protocol):
    """A channel's connection: identity, limits, output and scheduling."""

    vhost: VHost | None  # set once the connection is open, before any channel
    actor: Actor | None
    username: str
    name: str
    config: Config
    frame_max: int
    writable: bool
    published: bool  # has published (a resource alarm then stops reading it)
    blocked: bool
    confirms_pending: set[Any]  # channels with confirms to send at the end of the input batch
    settled_in_turn: int  # deliveries a multiple ack, a nack or a reject settled since the input turn began

    @property
    def sessions(self) -> ReplyRegistry: ...

    def send(self, data: bytes) -> None: ...

    def send_many(self, frames: list[bytes | memoryview]) -> None: ...

    def capability(self, name: str) -> bool: ...

    def update_reading(self) -> None: ...

    def remove_channel(self, channel_id: int) -> None: ...

    def schedule_channel_deliveries(self, channel: Any) -> None: ...

    def body_spool(self) -> BodySpool: ...
