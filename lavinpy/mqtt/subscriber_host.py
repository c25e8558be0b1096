"""What a client's subscriptions (``subscriptions``) need of their connection, of a vhost's retained
messages and of a queue that lets them take its delivery step."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    import asyncio

    from ..broker.ops import ProtocolCounters
    from ..broker.ops.deliveries import StoredMessage


class SubscriberHost(Protocol):
    """What the subscriptions need of their connection."""

    writable: bool
    counters: ProtocolCounters  # what the model counts the connection's traffic in

    def send(self, data: bytes) -> None: ...

    def send_after(self, wait: asyncio.Future[None] | None, data: bytes) -> None:
        """``data`` after ``wait`` (None: nothing) and the replies queued before it."""


class RetainedMessage(NamedTuple):
    """A retained message as the vhost's store gives it back (``retained``)."""

    payload: bytes
    qos: int
    properties: bytes | None  # the AMQP properties it was published with (an MQTT 5 publisher's)
    timestamp_ms: int  # when it was published (epoch ms; 0: not kept, an MQTT 3 publisher's)


class RetainedSource(Protocol):
    """A vhost's retained messages, as the subscriptions read them: the topics a filter matches, then
    each message when its turn comes (it may have been replaced, cleared or expired meanwhile)."""

    def topics(self, topic_filter: str) -> list[str]: ...

    def get(self, topic: str) -> RetainedMessage | None: ...


class RunSource(Protocol):
    """A classic queue handing its single-consumer delivery step to the consumer's channel."""

    def take_run(self, count: int) -> tuple[list[int], list[StoredMessage], list[bool] | None]:
        """Up to ``count`` ready messages, now unacked: positions, messages, redelivered flags."""
        ...

    def take_one(self) -> tuple[int, StoredMessage, bool] | None:
        """The head message, now unacked: (position, message, redelivered), or None when none is ready."""
        ...
