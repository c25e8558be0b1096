"""A read of in-order basic.acks settled in one compiled call: ``ack_head(deliveries, tags)``.

``_cwire.ack_head`` (_cwire_acks.c) takes the common case of ``Deliveries.ack_run`` (consecutive tags
acking the oldest deliveries of the channel's first run, on a classic queue without features) in one
call instead of the dozen Python calls its inline path makes, and returns False, with nothing changed,
for anything else. Its pure twin is that inline path itself: without the compiled module ``ack_head``
is None and the caller goes straight to ``ack_run``, which gives the same state
(tests/amqp/test_ack_head_agree.py).
"""

from __future__ import annotations

from collections.abc import Callable

from ...store.message_store import MessageStore
from ...store.queue_index import QueueIndex
from ...store.unacked_positions import UnackedPositions
from ...wire.accel import cwire
from ...wire.position import SEGMENT_MASK
from ..queues.consumer import Consumer
from ..queues.queue import Queue
from .deliveries import Deliveries
from .unacked_book import UnackedBook, _Run

__all__ = ["ack_head"]

ack_head: Callable[[Deliveries, list[int]], bool] | None = None
if cwire is not None:
    cwire.init_acks(UnackedBook, _Run, Queue, QueueIndex, UnackedPositions, Consumer, QueueIndex.ack,
                    MessageStore.decref, SEGMENT_MASK)
    ack_head = cwire.ack_head
