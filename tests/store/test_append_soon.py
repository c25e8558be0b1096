"""AppendFile.append_soon: records wait in memory for one write, and the store's durable() (every
fsync policy) writes them before it resolves, so a publisher confirm that waits for it finds them on
disk; without a flush they are written after a short delay."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from lavinpy.store import append_file
from lavinpy.store.vhost_store import VhostStore


def _store_and_file(directory: Path, **settings: Any) -> tuple[VhostStore, append_file.AppendFile]:
    """A recovered store in ``directory`` and its open append file ``cache``."""
    store = VhostStore(directory, **settings)
    store.open()
    store.finish_recovery()
    file = store.open_append_file("cache")
    file.open()
    return store, file


@pytest.mark.parametrize("policy", ["always", "batch", "never"])
def test_durable_writes_pending_records_first(tmp_path: Path, policy: str) -> None:
    async def scenario() -> None:
        store, file = _store_and_file(tmp_path / policy, fsync=policy, fsync_interval_ms=1)
        file.append_soon(b"one")
        file.append_soon(b"two")
        assert (tmp_path / policy / "cache").stat().st_size == 0  # not yet: one write for both
        await asyncio.shield(store.durable())
        assert (tmp_path / policy / "cache").read_bytes() == b"onetwo"
        store.close()

    asyncio.run(scenario())


def test_without_a_flush_they_are_written_after_a_short_delay(tmp_path: Path) -> None:
    async def scenario() -> None:
        store, file = _store_and_file(tmp_path, fsync="always")
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
        store, file = _store_and_file(tmp_path, fsync="always")
        queue = store.open_queue("q", durable=True)
        queue.push(store.messages.append("", "q", b"\x00\x00", b"body"))
        file.append_soon(b"x")
        assert queue.has_pending_writes
        await asyncio.sleep(append_file.WRITE_DELAY_S * 3)
        assert (tmp_path / "cache").read_bytes() == b"x"
        assert not queue.has_pending_writes  # with the OS: a kill -9 keeps both or neither
        store.close(clean=False)

    asyncio.run(scenario())


def test_records_after_a_flush_wait_their_own_delay_on_the_same_timer(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A group commit writes the waiting records; the next ones (after it) are not written early by
    the first batch's timer, which is set again for what is left of their delay: one timer, not one
    per batch, and no write between group commits that come every few milliseconds. (The timer's
    callbacks are run by hand: no sleeping.)"""
    async def scenario() -> None:
        store, file = _store_and_file(tmp_path, fsync="always")
        loop = asyncio.get_running_loop()
        timers: list[tuple[float, object]] = []
        call_later = loop.call_later

        def recording(delay: float, callback: Any, *args: Any) -> asyncio.TimerHandle:
            if getattr(callback, "__self__", None) is file:
                timers.append((delay, callback))
                return call_later(3600, lambda: None)  # run by hand below
            return call_later(delay, callback, *args)

        loop.call_later = recording  # type: ignore[method-assign]
        monkeypatch.setattr(append_file, "WRITE_DELAY_S", 3600.0)
        file.append_soon(b"a")
        await asyncio.shield(store.durable())
        assert (tmp_path / "cache").read_bytes() == b"a"
        file.append_soon(b"b")
        assert len(timers) == 1  # the first batch's timer serves the second
        timers[0][1]()  # it fires: "b" has not waited its delay yet
        assert (tmp_path / "cache").read_bytes() == b"a"
        assert len(timers) == 2 and 3500 < timers[1][0] <= 3600  # set again for what is left of it
        monkeypatch.setattr(append_file, "WRITE_DELAY_S", 0.0)
        timers[1][1]()
        assert (tmp_path / "cache").read_bytes() == b"ab"
        loop.call_later = call_later  # type: ignore[method-assign]
        store.close()

    asyncio.run(scenario())


def test_an_owner_that_renders_its_own_records_is_asked_once_per_write(tmp_path: Path) -> None:
    """``write_soon``: the owner keeps its records (a deduplication cache's table) and ``render`` gives
    them framed at the write: once for every call before it, at the group commit or after the delay,
    never when nothing was asked for since; an empty rendering appends nothing."""
    async def scenario() -> None:
        store, file = _store_and_file(tmp_path, fsync="always")
        rendered: list[bytes] = []

        def render() -> bytes:
            rendered.append(b"<%d>" % len(rendered) if len(rendered) != 2 else b"")
            return rendered[-1]

        file.render = render
        file.write_soon()
        file.write_soon()
        assert (tmp_path / "cache").stat().st_size == 0 and not rendered
        await asyncio.shield(store.durable())
        assert (tmp_path / "cache").read_bytes() == b"<0>"
        file.write_soon()
        await asyncio.sleep(append_file.WRITE_DELAY_S * 3)
        assert (tmp_path / "cache").read_bytes() == b"<0><1>"
        await asyncio.shield(store.durable())
        assert len(rendered) == 2  # nothing asked for since: not rendered
        file.write_soon()
        await asyncio.shield(store.durable())
        assert len(rendered) == 3 and (tmp_path / "cache").read_bytes() == b"<0><1>"
        store.close()

    asyncio.run(scenario())
