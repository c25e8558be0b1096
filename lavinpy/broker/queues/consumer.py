"""A consumer: a channel's subscription to a queue, with its own prefetch window."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .queue_consumer import DeliveryChannel

if TYPE_CHECKING:
    from .base import QueueKind
    from .consumer_set import ConsumerSet


class Consumer:
    __slots__ = ("tag", "queue", "channel", "no_ack", "exclusive", "priority", "prefetch",
                 "unacked", "arguments", "parked")

    def __init__(
        self,
        tag: str,
        queue: QueueKind,
        channel: DeliveryChannel,
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
        self.parked: ConsumerSet | None = None  # the set that parked it with its window full (consumer_set)

    def credit(self, count: int) -> None:
        """``count`` of this consumer's deliveries were settled: their prefetch credit comes back."""
        self.unacked -= count
        parked = self.parked
        if parked is not None:
            parked.unpark(self)

    def can_accept(self) -> bool:
        if not self.no_ack and self.prefetch and self.unacked >= self.prefetch:
            return False
        return self.channel.can_deliver()
