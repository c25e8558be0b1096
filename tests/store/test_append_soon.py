"""AppendFile.append_soon: records wait in memory for one write, and the store's durable() (every
fsync policy) writes them before it resolves, so a publisher confirm that waits for it finds them on
disk; without a flush they are written after a short delay."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from lavinpy.store import append_file
from lavinpy.store.vhost_store import VhostStore


@pytest.mark.parametrize("policy", ["always", "batch", "never"])
def test_durable_writes_pending_records_first(tmp_path: Path, policy: str) -> None:
    async def scenario() -> None:
        store = VhostStore(tmp_path / policy, fsync=policy, fsync_interval_ms=1)
        store.open()
        store.finish_recovery()
        file = store.open_append_file("cache")
        file.open()
        file.append_soon(b"one")
        file.append_soon(b"two")
        assert (tmp_path / policy / "cache").stat().st_size == 0  # not yet: one write for both
        await asyncio.shield(store.durable())
        assert (tmp_path / policy / "cache").read_bytes() == b"onetwo"
        store.close()

    asyncio.run(scenario())


def test_without_a_flush_they_are_written_after_a_short_delay(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = VhostStore(tmp_path, fsync="always")
        store.open()
        store.finish_recovery()
        file = store.open_append_file("cache")
        file.open()
        file.frame = lambda records: b"[" + records + b"]"
        file.append_soon(b"x")
        await asyncio.sleep(append_file.WRITE_DELAY_S * 3)
        assert (tmp_path / "cache").read_bytes() == b"[x]"
        store.close()

    asyncio.run(scenario())


def test_a_delayed_write_hands_the_index_entries_over_first(tmp_path: Path) -> None:
    """A record written on the delay (no flush yet) must not reach the OS before the index entries
    buffered until then: a deduplication record ahead of its message's entry would, after a kill -9,
    make the publisher's retry of the lost message a "duplicate"."""
    async def scenario() -> None:
        store = VhostStore(tmp_path, fsync="always")
        store.open()
        store.finish_recovery()
        queue = store.open_queue("q", durable=True)
        file = store.open_append_file("cache")
        file.open()
        queue.push(store.messages.append("", "q", b"\x00\x00", b"body"))
        file.append_soon(b"x")
        assert queue.has_pending_writes
        await asyncio.sleep(append_file.WRITE_DELAY_S * 3)
        assert (tmp_path / "cache").read_bytes() == b"x"
        assert not queue.has_pending_writes  # with the OS: a kill -9 keeps both or neither
        store.close(clean=False)

    asyncio.run(scenario())
