"""Queue index files opened on demand within a budget, and definitions synced by the group commit."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from pamqp import commands

from lavinpy.store import fsyncs
from lavinpy.store.definitions import DefinitionsLog
from lavinpy.store.entry_file import INDEX_FILES, OpenFiles, fd_budget
from lavinpy.store.vhost_store import VhostStore
from tests.helpers import make_store

BUDGET = 4


@pytest.fixture
def small_budget(monkeypatch: pytest.MonkeyPatch) -> OpenFiles:
    monkeypatch.setattr(INDEX_FILES, "_limit", BUDGET)
    return INDEX_FILES


def _record_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(fsyncs, "fsync_all", fsyncs.pool_fsync_all)  # a flush's files: through os.fsync
    monkeypatch.setattr(fsyncs, "ON_LOOP", False)  # not started from the loop in C workers
    return synced


def test_budget_follows_the_fd_limit() -> None:
    assert fd_budget(share=4, floor=1) >= 1
    assert fd_budget(share=10 ** 9, floor=8) == 8


def test_an_empty_durable_queue_holds_no_descriptor_and_no_directory(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    index = store.open_queue("q", durable=True)
    store.finish_recovery()
    assert index.open_files == 0
    assert not index.directory.exists()
    store.close()
    store = make_store(tmp_path)
    index = store.open_queue("q", durable=True)
    assert len(index) == 0 and index.open_files == 0
    store.close()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to name descriptors")
@pytest.mark.parametrize("fsync", ["always", "batch"])
def test_more_queues_than_the_budget_every_entry_synced_and_recovered(tmp_path: Path, small_budget: OpenFiles,
                                                                      fsync: str) -> None:
    count = 5 * BUDGET
    synced: list[str] = []

    async def scenario() -> None:
        store = VhostStore(tmp_path, fsync=fsync, fsync_interval_ms=1)
        store.open()
        queues = [store.open_queue(f"q{i}", durable=True) for i in range(count)]
        store.finish_recovery()
        for i, q in enumerate(queues):
            q.push(store.messages.append("", q.name, b"\x00\x00", f"m{i}".encode()))
        closed_before = small_budget.closed_idle
        with pytest.MonkeyPatch.context() as mp:
            recorded = _record_fsyncs(mp)
            await store.flush()
            synced.extend(recorded)
        assert sum(q.open_files for q in queues) <= BUDGET
        assert len(small_budget) <= BUDGET
        assert small_budget.closed_idle - closed_before >= count - BUDGET
        store.close(clean=False)  # as a killed process leaves the files

    asyncio.run(scenario())
    enq_files = {str(tmp_path / d / "enq") for d in os.listdir(tmp_path) if (tmp_path / d / "enq").exists()}
    assert len(enq_files) == count
    assert enq_files <= set(synced), "an enq file closed from the budget was not synced by the flush"
    store = make_store(tmp_path)
    for i in range(count):
        q = store.open_queue(f"q{i}", durable=True)
        assert len(q) == 1
        assert q.open_files == 0  # read at recovery, then closed
    store.close()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to name descriptors")
def test_a_flush_syncs_the_segment_and_the_enq_file(tmp_path: Path) -> None:
    async def scenario() -> list[str]:
        store = VhostStore(tmp_path, fsync="always")
        store.open()
        q = store.open_queue("q", durable=True)
        store.finish_recovery()
        q.push(store.messages.append("", "q", b"\x00\x00", b"m"))
        with pytest.MonkeyPatch.context() as mp:
            synced = _record_fsyncs(mp)
            await store.flush(acks=False)
        store.close(clean=False)
        return synced

    synced = asyncio.run(scenario())
    assert {"enq", "msgs.0000000001"} <= {Path(p).name for p in synced}


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to name descriptors")
def test_definitions_under_group_commit_are_synced_by_the_flush(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = VhostStore(tmp_path, fsync="always")
        store.open()
        store.finish_recovery()
        log = DefinitionsLog(tmp_path / "definitions.amqp")
        log.load()
        store.register_synced_file(log)
        log.group_commit = True
        with pytest.MonkeyPatch.context() as mp:
            synced = _record_fsyncs(mp)
            for i in range(50):
                log.append(commands.Queue.Declare(queue=f"q{i}", durable=True))
            assert synced == []  # handed to the OS, not synced one by one
            assert log.has_unsynced
            await store.flush()
            assert [Path(p).name for p in synced] == ["definitions.amqp"]  # one fsync for fifty declares
            assert not log.has_unsynced
        store.close()
        log.close()

    asyncio.run(scenario())
    log = DefinitionsLog(tmp_path / "definitions.amqp")
    assert len(log.load()) == 50
    log.close()
