"""The group commit's fsyncs, started from the event loop in compiled workers or run in the flush's worker
thread: a flush resolves only after every file of it was synced (and the followers acknowledged it), a
failed fsync fails the flush with its errno on either path, and a close finishes a running batch."""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from lavinpy.store import fsyncs
from lavinpy.store.vhost_store import VhostStore
from tests.helpers import make_store


class PipeFile:
    """A synced file whose next flush hands over a pipe's descriptor: its fsync fails with EINVAL."""

    def __init__(self) -> None:
        self.read_end, self.write_end = os.pipe()
        self.has_unsynced = True
        self.marked = 0
        self.close_fd: Callable[[int], None] = os.close

    def take_unsynced_fds(self) -> list[int]:
        if not self.has_unsynced:
            return []
        self.has_unsynced = False
        return [self.read_end]

    def mark_unsynced(self) -> None:
        self.marked += 1

    def close(self) -> None:
        os.close(self.read_end)
        os.close(self.write_end)


class HeldBarrier:
    """A replication leader whose followers acknowledge when the test says so."""

    def __init__(self) -> None:
        self.callbacks: list[Callable[[], None]] = []

    def wait_replicated(self) -> asyncio.Future[None]:
        raise NotImplementedError

    def on_replicated(self, callback: Callable[[], None]) -> None:
        self.callbacks.append(callback)


def publish(store: VhostStore, count: int = 3) -> None:
    q = store.open_queue("q", durable=True)
    for i in range(count):
        q.push(store.messages.append("", "q", b"\x00\x00", bytes([i % 251]) * 100))


async def flushed_store(tmp_path: Path) -> VhostStore:
    """A store at ``fsync: always`` whose queue ``q`` holds 3 messages, flushed once: the queue's directory and
    first segment name are synced (through the worker thread), so the next flush of the same files is an
    ordinary one."""
    store = make_store(tmp_path, fsync="always")
    store.finish_recovery()
    publish(store)
    await store.flush()
    return store


def test_a_failed_fsync_fails_the_flush_and_the_next_one_syncs(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = await flushed_store(tmp_path)
        broken = PipeFile()
        store.register_synced_file(broken)
        publish(store)
        flushes = store.flush_count
        with pytest.raises(OSError) as failed:
            await store.flush()
        assert failed.value.errno == errno.EINVAL
        assert broken.marked == 1 and store.flush_count == flushes
        assert store.pending  # the queue's entries are not known to be on disk: the next flush takes them
        await store.flush()
        assert store.flush_count == flushes + 1
        store.close()
        broken.close()

    asyncio.run(scenario())


@pytest.mark.skipif(not fsyncs.ON_LOOP, reason="needs the compiled store")
def test_an_ordinary_flush_starts_its_fsyncs_from_the_loop(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = await flushed_store(tmp_path)
        publish(store)
        await store.flush()
        assert store._loop_fsyncs is not None
        posted, started, finished = store._loop_fsyncs.last
        assert 0 < posted <= started <= finished
        assert not store.pending
        store.close()

    asyncio.run(scenario())


@pytest.mark.skipif(not fsyncs.ON_LOOP, reason="needs the compiled store")
def test_confirms_wait_for_the_local_sync_and_the_followers(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = await flushed_store(tmp_path)
        barrier = HeldBarrier()
        store.barrier = barrier
        publish(store)
        flushes = store.flush_count
        waiter = store.durable()
        while store.flush_count == flushes:  # the local sync is done ...
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.01)
        assert not waiter.done()  # ... but the followers have not acknowledged it
        barrier.callbacks.pop()()
        await asyncio.wait_for(waiter, 5)
        store.barrier = None
        store.close()

    asyncio.run(scenario())


@pytest.mark.skipif(not fsyncs.ON_LOOP, reason="needs the compiled store")
def test_close_during_a_loop_sync_releases_its_waiters(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = await flushed_store(tmp_path)
        publish(store, 1000)
        waiter = store.durable()
        while not (store._loop_fsyncs is not None and store._loop_fsyncs.running):
            await asyncio.sleep(0)
        store.close()  # finishes the batch: what it synced is on disk
        await asyncio.wait_for(asyncio.shield(waiter), 5)
        store = make_store(tmp_path)
        assert len(list(store.open_queue("q", durable=True))) == 1003
        store.close()

    asyncio.run(scenario())
