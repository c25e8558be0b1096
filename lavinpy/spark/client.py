"""The Spark tasks' AMQP 0-9-1 connection: lavinpy.wire's blocking client, named as the data source."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import socket
import time
from collections.abc import Callable, Iterator
from typing import Self, TypeVar

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
           "connection_gone", "gc_paused", "reconnecting", "server_product"]

_T = TypeVar("_T")
REOPEN_PAUSE_S = 0.5  # between attempts to reach the broker again after a connection was lost


def connection_gone(exc: Exception) -> bool:
    """Whether ``exc`` ended the connection (lost, or closed by the broker, as a broker restarting
    does), rather than refusing one method."""
    return isinstance(exc, ConnectionLost) or (isinstance(exc, BrokerClosed) and exc.scope == "connection")


def reconnecting(attempt: Callable[[], _T], timeout: float, reset: Callable[[], None] = lambda: None) -> _T:
    """``attempt()`` again each time it loses its connection (``reset()`` after each loss), for
    ``timeout`` seconds: a broker restarting takes a moment."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return attempt()
        except ConnectionLost:
            reset()
            if time.monotonic() > deadline:
                raise
            time.sleep(REOPEN_PAUSE_S)


def server_product(conn: BlockingConnection) -> str:
    """The broker's name as its connection.start gave it (``lavinpy``, ``RabbitMQ``, ``LavinMQ``)."""
    product = conn.server_properties.get("product")
    return product.decode(errors="replace") if isinstance(product, bytes) else str(product)


# A read task receives about 90 MB a million rows. With the kernel's receive autotuning, a fresh
# connection's window starts small and grows with what the task reads a round trip, and a broker held
# at the window sends each time an ACK opens it, in the receiving core's softirq: on the core Spark
# runs on. A fixed 4 MiB buffer (the window about as large) took a classic read's two tasks 6-8 ms
# less a million rows (bench/history.md). Only where net.core.rmem_max allows that much: a buffer the
# kernel caps lower would also turn the autotuning off, and that reads slower (1 MiB did).
RECEIVE_BUFFER = 4 << 20


def _rmem_max() -> int:
    try:
        with open("/proc/sys/net/core/rmem_max") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 0


_FIXED_RECEIVE_BUFFER = _rmem_max() >= RECEIVE_BUFFER


class Connection(BlockingConnection):
    """One blocking connection of a Spark task (or the driver's probe)."""

    def __init__(self, params: AMQPParams) -> None:
        super().__init__(params, product="lavinpy.spark")

    def open(self) -> Self:
        """Connected as the base does, then the fixed receive buffer (above) where the system allows it."""
        super().open()
        if _FIXED_RECEIVE_BUFFER and self.sock is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        return self


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for one task.

    A task allocates millions of short-lived, acyclic objects (reference counting frees them), and
    each of the collector's passes over a Spark worker's heap is wasted work: measured, it halves
    a reader's throughput. Restored when the task's iterator ends or is closed. In a Spark task, the
    worker process is also prepared, once (``prepare_worker``).
    """
    prepare_worker()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


_worker_prepared = False


def prepare_worker() -> None:
    """Once a process, in a Spark task only: what the Python worker holds when its first lavinpy task
    starts (its imports, Spark's own state) is moved out of the cyclic collector's reach (gc.freeze),
    and the memory a task frees stays with the process (``keep_freed_memory``).

    Spark's Python daemon runs a full collection after every task of a reused worker, which walked
    those 40,000 objects each time: 14-21 ms of CPU a task on the executor's core, measured; frozen,
    it walks only what later tasks made. What the worker held then in reference cycles and drops
    later is never collected: a task's start, once a process. Never in a driver (no task context):
    its heap and its allocator's settings are the application's.
    """
    global _worker_prepared
    if _worker_prepared:  # not gc.get_freeze_count(), which walks every frozen object (0.4-2.9 ms a task)
        return
    from pyspark import TaskContext

    if TaskContext.get() is None:
        return
    gc.freeze()
    keep_freed_memory()
    _worker_prepared = True


# glibc's mallopt parameters (malloc.h), and the values a read task needs: a batch's columns (a 1 MB
# body buffer at 8,192 rows of 100 B) and the receive buffer come from the heap and go back to it.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_TRIM_THRESHOLD = 32 << 20
_MMAP_THRESHOLD = 8 << 20


def keep_freed_memory() -> bool:
    """Let glibc's malloc keep up to 32 MB freed at the top of the heap (and serve blocks up to 8 MB
    from the heap) instead of handing each batch's buffers back to the kernel as they are freed.

    A read task allocates a batch's columns and grows its receive buffer, then frees them once Spark
    has the batch; with glibc's adaptive defaults the freed top of the heap went back to the kernel
    each time, and every page of the next batch's buffers was faulted in and zeroed again: 11,000
    page faults a task of 524,288 rows, 0.03 us a row of the task's CPU. Kept, 900. False where the
    C library has no mallopt (not glibc), which changes nothing else."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)) and bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD))
