"""Failures injected under a real broker's durability, for the tests of replies after the disk: the
disk fails under the default vhost's store, or the cluster's in-sync followers stop acknowledging.
Each returns the call that heals it."""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Callable
from typing import Any

from lavinpy.broker.broker import Broker


def fail_fsync(broker: Broker) -> Callable[[], None]:
    """From now on the disk fails under the default vhost's store; the returned call heals it."""
    store = broker.vhosts["/"].store

    def failing_sync(*_: Any) -> None:
        raise OSError(errno.EIO, "Input/output error (injected)")
    # The failing disk is the worker thread's ``_sync``: every flush takes it while the fault lasts (the
    # fsyncs started from the loop fail through the same reply path: tests/store/test_flush_fsyncs.py).
    store._sync = failing_sync  # type: ignore[method-assign]
    store.fsyncs_on_loop = False

    def heal() -> None:
        del store._sync
        store.fsyncs_on_loop = True
    return heal


class FailingReplication:
    """A replication leader whose followers never acknowledge: every wait for them fails."""

    def wait_replicated(self) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.set_exception(ConnectionError("in-sync followers lost (injected)"))
        return future

    def on_replicated(self, callback: Callable[[], None]) -> None:
        raise ConnectionError("in-sync followers lost (injected)")


def fail_replication(broker: Broker) -> Callable[[], None]:
    broker.set_replication(None, FailingReplication())
    return lambda: broker.set_replication(None, None)


FAILURES = {"fsync": fail_fsync, "replication": fail_replication}
