"""A consumer as a queue sees it, and the channel it delivers through (a leaf: queues deliver to
these without importing ``consumer``, which itself names the queue kind)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ...store.record import StoredMessage


class DeliveryChannel(Protocol):
    """What a queue needs from the channel that owns a consumer (the session layer implements it)."""

    def can_deliver(self) -> bool: ...

    def deliver(self, consumer: Any, pos: int, msg: StoredMessage, redelivered: bool) -> None: ...

    def deliver_run(self, consumer: Any, positions: list[int], messages: list[StoredMessage],
                    redelivered: list[bool] | None) -> None: ...

    def delivery_room(self) -> int:
        """Deliveries the channel-wide prefetch still allows (a large number without one)."""
        ...

    def consumer_cancelled(self, consumer: Any) -> None: ...


class QueueConsumer(Protocol):
    """The consumer members a queue reads and settles (``consumer.Consumer`` has them all)."""

    tag: str
    no_ack: bool
    exclusive: bool
    priority: int
    prefetch: int  # 0 = unlimited
    unacked: int
    arguments: dict[str, Any]
    parked: Any  # the consumer set holding it off its delivery heap while its window is full, or None

    @property
    def channel(self) -> DeliveryChannel: ...

    def can_accept(self) -> bool: ...

    def credit(self, count: int) -> None: ...
