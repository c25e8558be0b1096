"""The QoS 2 session state's file on a real vhost: replayed at open, a torn last record dropped,
rewritten when it holds mostly stale records, and reported to the store's change feed (what a cluster's
replication streams to its followers) so a follower's copy replays to the same state."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from lavinpy.mqtt import exactly_once
from lavinpy.mqtt.exactly_once import FILE_NAME, QoS2Store, VHostQoS2
from lavinpy.store import changes
from tests.broker.model_harness import Model

from .test_mqtt_retained_file import _apply, _Feed


@pytest.fixture
def model(tmp_path: Path):
    m = Model(tmp_path / "data")
    yield m
    changes.attach(tmp_path, None)
    m.close()


def _summary(store: VHostQoS2) -> dict[str, tuple[set[int], dict[int, int], list[int], set[str]]]:
    return {cid: (s.inbound, s.sent, list(s.pubrel_owed), s.filters) for cid, s in store.clients.items()}


def test_replay_torn_tail_and_clean_session_drop(model: Model) -> None:
    state = QoS2Store().session(model.vhost, "dev", persistent=True)
    assert state.received(5)  # fsync always: the PUBREC waits for durable()
    state.received(6)
    assert state.released(5)
    size = (model.vhost.path / FILE_NAME).stat().st_size
    assert state.released(99)  # unknown: nothing recorded, the PUBCOMP still waits for a flush (an
    assert (model.vhost.path / FILE_NAME).stat().st_size == size  # earlier PUBREL's record may)
    state.sending(1234, 7)
    state.sending(1300, 8)
    state.pubrec(7)
    state.grant("a/#", True)
    other = QoS2Store().session(model.vhost, "other", persistent=True)
    other.received(1)
    path = model.vhost.path / FILE_NAME
    whole = path.stat().st_size
    model.close()  # as a crash, a record cut short after the whole ones
    with open(path, "ab") as f:
        f.write(exactly_once.RECEIVED + b"\x00\x03de")
    model.reopen()
    store = QoS2Store().of(model.vhost)
    assert _summary(store) == {"dev": ({6}, {1300: 8}, [7], {"a/#"}), "other": ({1}, {}, [], set())}
    assert path.stat().st_size == whole
    assert store.session("dev", persistent=False).empty  # a clean session: dropped, on disk too
    model.reopen()
    assert _summary(QoS2Store().of(model.vhost)) == {"other": ({1}, {}, [], set())}


def test_rewritten_when_mostly_stale_and_replicated(model: Model, monkeypatch: Any, tmp_path: Path) -> None:
    feed = _Feed()
    changes.attach(tmp_path, feed)
    monkeypatch.setattr(exactly_once, "COMPACT_MIN_BYTES", 500)
    vhost = model.vhost

    async def scenario() -> None:
        state = QoS2Store().session(vhost, "device-1", persistent=True)
        state.grant("x/+", True)
        for packet_id in range(1, 200):
            state.received(packet_id)
            state.released(packet_id)
            state.sending(packet_id * 10, packet_id)
            state.pubrec(packet_id)
            if packet_id != 199:
                state.pubcomp(packet_id)
        state.received(500)
        await vhost.durable(acks=False)

    asyncio.run(scenario())
    path = vhost.path / FILE_NAME
    assert path.stat().st_size < 600
    kinds = {kind for kind, rel, _ in feed.ops if rel.endswith(FILE_NAME)}
    assert kinds == {"append", "replace"}, feed.ops
    copy = _apply(feed.ops, tmp_path, FILE_NAME)
    assert copy == path.read_bytes()
    expected = {"device-1": ({500}, {}, [199], {"x/+"})}
    model.reopen()
    assert _summary(QoS2Store().of(model.vhost)) == expected
