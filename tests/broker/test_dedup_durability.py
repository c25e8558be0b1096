"""When a deduplication cache's file is fsynced, and what a restart reads back: a queue's cache file is
synced only by the group commits that sync the ack files (a publisher confirm's commit writes it but
does not sync it), an exchange's by every commit; the records a queue's file lost after its last sync
(a power loss) are read back from the queued messages' headers, so only the identifiers of messages
removed in that window can be forgotten."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from lavinpy.broker.broker import Broker
from lavinpy.broker.ops import objects as operations_objects
from lavinpy.broker.queues.dedup_cache import file_name
from lavinpy.config import Config
from lavinpy.store import fsyncs, vhost_store
from tests.broker.model_harness import Model, run

ON = {"message_deduplication": True}


def send(m: Model, key: str, ident: str, exchange: str = "", **headers: object) -> None:
    m.publish(key, ident.encode(), exchange, headers={"x-deduplication-header": ident, **headers}, delivery_mode=2)


def power_loss(m: Model, path: Path, keep: bytes) -> None:
    """Stop, then leave the cache file as its last sync did (``keep``), and start again."""
    m.broker.close()
    path.write_bytes(keep)
    m.broker = Broker(Config(data_dir=str(m.path), **m.settings))
    m.broker.open()


def test_a_queue_cache_is_synced_with_the_acks_an_exchange_cache_with_every_commit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[list[int]] = []
    real = vhost_store.fsync_together

    def recording(fds: list[int]) -> None:
        synced.append(list(fds))
        real(fds)

    monkeypatch.setattr(vhost_store, "fsync_together", recording)
    monkeypatch.setattr(fsyncs, "ON_LOOP", False)  # every flush's fsyncs through fsync_together, recorded

    async def body(m: Model) -> None:
        store = m.vhost.store
        m.declare("q", durable=True, **ON)
        operations_objects.declare_exchange(None, m.vhost, "dx", "direct", durable=True,
                                            arguments={"x-message-deduplication": True})
        m.declare("t", durable=True)
        m.bind("t", "dx", "k")
        await store.flush()
        queue_file = store.open_append_file(file_name("q", "q"))
        exchange_file = store.open_append_file(file_name("x", "dx"))
        send(m, "q", "a")
        send(m, "k", "b", "dx")
        synced.clear()
        await store.flush(acks=False)  # a publisher confirm's commit
        fds = [fd for call in synced for fd in call]
        assert exchange_file._fd in fds and queue_file._fd not in fds
        assert queue_file.has_unsynced  # (the periodic flush is due)
        assert (store.path / file_name("q", "q")).stat().st_size > 0  # written all the same
        synced.clear()
        await store.flush()  # the ack files' commit
        assert queue_file._fd in [fd for call in synced for fd in call]
        assert not queue_file.has_unsynced
    run(body, tmp_path)


def test_records_lost_after_the_last_sync_are_read_back_from_the_queued_messages(tmp_path: Path) -> None:
    async def body(m: Model) -> None:
        m.declare("q", durable=True, **ON)
        path = m.vhost.store.path / file_name("q", "q")
        send(m, "q", "a")
        send(m, "q", "b")
        await m.vhost.store.flush()
        synced = path.read_bytes()  # what the file held at its last sync
        send(m, "q", "c")
        send(m, "q", "d")
        await m.vhost.store.flush(acks=False)
        assert m.get("q", 1)[0]["payload"] == "a"  # a removed message: its record was synced
        await m.vhost.store.flush()
        power_loss(m, path, synced)
        for ident in ("a", "b", "c", "d", "e"):
            send(m, "q", ident)
        assert m.bodies("q") == ["b", "c", "d", "e"]
        assert m.vhost.get_queue("q").stats.duplicates == 4
    run(body, tmp_path)


def test_a_file_without_its_mark_reads_back_every_queued_message(tmp_path: Path) -> None:
    """An empty file (its first write lost, or a file from before the marks): every queued message's
    identifier is read back, and the file gets them with a mark."""
    async def body(m: Model) -> None:
        q = m.declare("q", durable=True, message_deduplication=True, cache_ttl=60_000)
        path = m.vhost.store.path / file_name("q", "q")
        send(m, "q", "a")
        send(m, "q", "b", **{"x-cache-ttl": 1})  # its own TTL, from its publish time
        send(m, "q", "plain")
        m.publish("q", b"no-id", delivery_mode=2)
        stamp = q.dedup.entries["a"] - 60_000 if q.dedup is not None else 0
        await asyncio.sleep(0.1)
        power_loss(m, path, b"")
        cache = m.vhost.get_queue("q").dedup
        assert cache is not None and list(cache.entries) == ["a", "b", "plain"]
        a_time, b_time = cache.entries["a"] - 60_000, cache.entries["b"] - 1
        # each from its own message's publish time (b's after a's), not from the restart 100 ms later
        assert a_time <= b_time and abs(a_time - stamp) <= 50 and b_time - stamp <= 50
        await m.vhost.store.flush()
        power_loss(m, path, path.read_bytes())
        cache = m.vhost.get_queue("q").dedup
        assert cache is not None and cache._mark is not None and list(cache.entries) == ["a", "b", "plain"]
        send(m, "q", "a")
        send(m, "q", "b")  # expired: stored again
        assert m.bodies("q") == ["a", "b", "plain", "no-id", "b"]
    run(body, tmp_path)
