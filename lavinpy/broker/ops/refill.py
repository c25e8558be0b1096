"""The compiled refill of a consumer's freed window from its classic queue's backlog (_cwire_refill.c):
the first round of ``DeliveryScheduler.run_deliveries`` in one call for its commonest case, given the
classes whose methods it inlines. The model's are named here; the channel's by the session layer that
owns it (``init_refill``). Its pure twin is the round run_deliveries' loop runs."""

from __future__ import annotations

from ...store.queue_index import QueueIndex
from ...store.record import CorruptRecord
from ...store.unacked_positions import UnackedPositions
from ...wire.accel import cwire
from ..queues.base import DELIVERY_BATCH, RUN_SHARE
from ..queues.consumer import Consumer
from ..queues.consumer_set import ConsumerSet
from ..queues.queue import Queue
from ..scheduler import DeliveryScheduler
from .replies import ReplyQueue

__all__ = ["init_refill"]


def init_refill(channel: type) -> None:
    """Set up the compiled refill for consumers on channels of class ``channel`` (whose ``can_deliver``
    it inlines: its flow, closing, connection's writable, ``ReplyQueue.waiting`` and channel-wide prefetch)."""
    if cwire is not None:
        cwire.init_refill(DeliveryScheduler, Queue, QueueIndex, UnackedPositions, ConsumerSet, Consumer, CorruptRecord,
                          channel, ReplyQueue, DELIVERY_BATCH * RUN_SHARE)  # Queue.deliver's for such a round
