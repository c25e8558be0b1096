"""The Spark tasks' AMQP 0-9-1 connection: lavinpy.wire's blocking client, named as the data source."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

from lavinpy.wire.client_blocking import (
    DEFAULT_PORT,
    AMQPClientError,
    AMQPParams,
    BlockingConnection,
    BrokerClosed,
    ConnectionLost,
    Frame,
)

__all__ = ["DEFAULT_PORT", "AMQPClientError", "AMQPParams", "BrokerClosed", "Connection", "ConnectionLost", "Frame",
           "gc_paused"]


class Connection(BlockingConnection):
    """One blocking connection of a Spark task (or the driver's probe)."""

    def __init__(self, params: AMQPParams) -> None:
        super().__init__(params, product="lavinpy.spark")


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for one task.

    A task allocates millions of short-lived, acyclic objects (reference counting frees them), and
    each of the collector's passes over a Spark worker's heap is wasted work: measured, it halves
    a reader's throughput. Restored when the task's iterator ends or is closed.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
