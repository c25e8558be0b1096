"""A consumer: a channel's subscription to a queue, with its own prefetch window."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..store.record import StoredMessage
    from .queue_base import QueueKind


class ConsumerChannel(Protocol):
    """What a queue needs from the channel that owns a consumer (the session layer implements it)."""

    def can_deliver(self) -> bool: ...

    def deliver(self, consumer: Consumer, pos: int, msg: StoredMessage, redelivered: bool) -> None: ...

    def deliver_run(self, consumer: Consumer, positions: list[int], messages: list[StoredMessage],
                    redelivered: list[bool] | None) -> None: ...

    def delivery_room(self) -> int:
        """Deliveries the channel-wide prefetch still allows (a large number without one)."""
        ...

    def consumer_cancelled(self, consumer: Consumer) -> None: ...


class Consumer:
    __slots__ = ("tag", "queue", "channel", "no_ack", "exclusive", "priority", "prefetch",
                 "unacked", "arguments")

    def __init__(
        self,
        tag: str,
        queue: QueueKind,
        channel: ConsumerChannel,
        *,
        no_ack: bool = False,
        exclusive: bool = False,
        priority: int = 0,
        prefetch: int = 0,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        self.tag = tag
        self.queue = queue
        self.channel = channel
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.priority = priority
        self.prefetch = prefetch  # 0 = unlimited (per-consumer limit, basic.qos global=false)
        self.unacked = 0
        self.arguments = arguments or {}

    def credit(self, count: int) -> None:
        """``count`` of this consumer's deliveries were settled: their prefetch credit comes back."""
        self.unacked -= count

    def can_accept(self) -> bool:
        if not self.no_ack and self.prefetch and self.unacked >= self.prefetch:
            return False
        return self.channel.can_deliver()
