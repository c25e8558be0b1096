"""The retained messages' file on a real vhost: replayed at open, a torn last record dropped, rewritten
when it holds mostly replaced records, reported to the store's change feed (what replication streams)
and synced by the store's group commit, not per record."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from lavinpy.broker.broker import Broker
from lavinpy.mqtt import retained
from lavinpy.mqtt.retained import FILE_NAME, RetainedStore
from lavinpy.store import changes, fsyncs
from tests.broker.model_harness import Model


class _Feed:
    """A change listener recording what a replication leader would stream."""

    def __init__(self) -> None:
        self.ops: list[tuple[str, str, Any]] = []

    def file_appended(self, rel_path: str, offset: int, data: bytes) -> None:
        self.ops.append(("append", rel_path, (offset, data)))

    def file_replaced(self, rel_path: str, data: bytes) -> None:
        self.ops.append(("replace", rel_path, data))

    def file_truncated(self, rel_path: str, size: int) -> None:
        self.ops.append(("truncate", rel_path, size))

    def file_deleted(self, rel_path: str) -> None:
        self.ops.append(("delete", rel_path, None))

    def dir_deleted(self, rel_path: str) -> None:
        self.ops.append(("rmdir", rel_path, None))


def _apply(ops: list[tuple[str, str, Any]], root: Path, name: str) -> bytes:
    """A follower's copy of one file after the ops (absolute, so replayable)."""
    data = bytearray()
    for kind, rel, arg in ops:
        if not rel.endswith(name):
            continue
        if kind == "append":
            offset, chunk = arg
            data[offset:offset + len(chunk)] = chunk
        elif kind == "replace":
            data = bytearray(arg)
        elif kind == "truncate":
            del data[arg:]
    return bytes(data)


@pytest.fixture
def model(tmp_path: Path):
    m = Model(tmp_path / "data")
    yield m
    changes.attach(tmp_path, None)
    m.close()


def test_replay_and_torn_tail(model: Model) -> None:
    vhost = model.vhost
    store = RetainedStore()
    assert store.put(vhost, "a/b", b"one", 1)  # fsync always: the PUBACK waits for durable()
    store.put(vhost, "a/c", b"two", 0)
    store.put(vhost, "a/c", b"", 0)
    path = vhost.path / FILE_NAME
    whole = path.stat().st_size
    model.close()  # as a crash: nothing compacted, and a record cut short after the whole ones
    with open(path, "ab") as f:
        f.write(b"R\x00\x03a/dX")
    model.broker = Broker(model.broker.config)
    model.broker.open()
    assert RetainedStore().matching(model.vhost, "a/+") == [("a/b", b"one", 1)]
    assert path.stat().st_size == whole  # the torn tail is cut off


def test_rewritten_when_mostly_replaced(model: Model, monkeypatch: Any) -> None:
    monkeypatch.setattr(retained, "COMPACT_MIN_BYTES", 1000)
    store = RetainedStore()
    for i in range(200):
        store.put(model.vhost, "t", b"%03d" % i, 1)
    assert (model.vhost.path / FILE_NAME).stat().st_size < 1000 + 100
    model.reopen()
    assert RetainedStore().matching(model.vhost, "#") == [("t", b"199", 1)]


def test_changes_reach_the_feed_and_sync_with_the_group_commit(model: Model, monkeypatch: Any,
                                                               tmp_path: Path) -> None:
    feed = _Feed()
    changes.attach(tmp_path, feed)
    monkeypatch.setattr(retained, "COMPACT_MIN_BYTES", 400)
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    monkeypatch.setattr(fsyncs, "ON_LOOP", False)  # the flush's fsyncs through os.fsync, not the loop's C workers
    vhost, store = model.vhost, RetainedStore()

    async def scenario() -> None:
        for i in range(15):  # 315 bytes: below the rewrite
            assert store.put(vhost, f"t/{i % 3}", b"payload-%02d" % i, 1)
        assert not synced  # no fsync per record: they wait for the group commit
        assert vhost.store.pending
        await vhost.durable(acks=False)
        assert len(synced) == 1 and not vhost.store.pending  # one fsync for the fifteen
        for i in range(15, 40):  # past 400 bytes, mostly replaced: rewritten once on the way
            store.put(vhost, f"t/{i % 3}", b"payload-%02d" % i, 1)
        await vhost.durable(acks=False)

    asyncio.run(scenario())
    kinds = {kind for kind, rel, _ in feed.ops if rel.endswith(FILE_NAME)}
    assert kinds == {"append", "replace"}, feed.ops  # appends and at least one rewrite, all reported
    copy = _apply(feed.ops, tmp_path, FILE_NAME)
    assert copy == (vhost.path / FILE_NAME).read_bytes()
    expected = {f"t/{k}": retained.RetainedMessage(b"payload-%02d" % max(i for i in range(40) if i % 3 == k), 1,
                                                   None, 0) for k in range(3)}
    assert retained._parse(copy, "copy")[0] == expected


def test_properties_and_time_are_kept_with_the_payload_across_a_restart_and_a_rewrite(
        model: Model, monkeypatch: Any) -> None:
    """An MQTT 5 publisher's AMQP properties and time come back with the payload; the expiry they name
    is checked against that time. A plain (MQTT 3) message keeps neither."""
    from lavinpy.wire.properties import encode_property_values

    monkeypatch.setattr(retained, "COMPACT_MIN_BYTES", 1000)
    props = encode_property_values(content_type="text/plain", headers={"a": "2"})
    expiring = encode_property_values(expiration="60000")
    store = RetainedStore()
    store.put(model.vhost, "p/props", b"with", 2, props, 1_700_000_000_000)
    store.put(model.vhost, "p/plain", b"without", 1)
    store.put(model.vhost, "p/old", b"expired", 1, expiring, 1_000)  # a minute after 1970
    store.put(model.vhost, "p/new", b"fresh", 1, expiring, 10 ** 13)  # in the year 2286
    for i in range(100):  # mostly replaced records: the file is rewritten with the live ones
        store.put(model.vhost, "p/churn", b"%03d" % i, 0)
    model.reopen()
    again = RetainedStore().of(model.vhost)
    assert again.get("p/props") == retained.RetainedMessage(b"with", 2, props, 1_700_000_000_000)
    assert again.get("p/plain") == retained.RetainedMessage(b"without", 1, None, 0)
    assert "p/old" in again.topics("p/+") and again.get("p/old") is None  # kept, but expired: not given
    assert again.get("p/new") == retained.RetainedMessage(b"fresh", 1, expiring, 10 ** 13)
    assert RetainedStore().matching(model.vhost, "p/props") == [("p/props", b"with", 2)]
