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
    a reader's throughput. Restored when the task's iterator ends or is closed. In a Spark task, the
    worker's heap is also frozen, once (``freeze_worker_heap``).
    """
    freeze_worker_heap()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


_heap_frozen = False


def freeze_worker_heap() -> None:
    """Once a process, in a Spark task only: what the Python worker holds when its first lavinpy task
    starts (its imports, Spark's own state) is moved out of the cyclic collector's reach (gc.freeze).

    Spark's Python daemon runs a full collection after every task of a reused worker, which walked
    those 40,000 objects each time: 14-21 ms of CPU a task on the executor's core, measured; frozen,
    it walks only what later tasks made. What the worker held then in reference cycles and drops
    later is never collected: a task's start, once a process. Never in a driver (no task context):
    its heap is the application's.
    """
    global _heap_frozen
    if _heap_frozen:  # not gc.get_freeze_count(), which walks every frozen object (0.4-2.9 ms a task)
        return
    from pyspark import TaskContext

    if TaskContext.get() is None:
        return
    gc.freeze()
    _heap_frozen = True
