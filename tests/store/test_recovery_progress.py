"""A restart's recovery of a large backlog logs how far it got (a line per 10 % of the index entries)."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

import pytest

from lavinpy.store import vhost_store
from tests import helpers

make_store = partial(helpers.make_store, segment_size=1 << 20, fsync="never")


def test_recovery_logs_progress_per_ten_percent(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    store = make_store(tmp_path)
    for name, count in (("big", 300), ("small", 100)):
        index = store.open_queue(name, durable=True)
        for i in range(count):
            index.push(store.messages.append("", name, b"\x00\x00", b"m%d" % i))
    store.finish_recovery()
    store.close()

    monkeypatch.setattr(vhost_store, "RECOVERY_PROGRESS_MIN_ENTRIES", 100)
    caplog.set_level(logging.INFO, logger="lavinpy.store")
    store = make_store(tmp_path)
    order = store.queue_names_on_disk()
    for name in order:
        store.open_queue(name, durable=True)
    store.finish_recovery()
    lines = [r.getMessage() for r in caplog.records if "recovering queue indexes" in r.getMessage()]
    first = 300 if order[0] == "big" else 100  # a line once each queue is read, at the 10 % step it reached
    assert lines == [f"{store.path}: recovering queue indexes: {first // 4}% ({first} of 400 index entries)",
                     f"{store.path}: recovering queue indexes: 100% (400 of 400 index entries)"]
    assert len(store.queues["big"]) == 300
    store.close()

    caplog.clear()
    monkeypatch.setattr(vhost_store, "RECOVERY_PROGRESS_MIN_ENTRIES", 1_000_000)
    store = make_store(tmp_path)
    for name in store.queue_names_on_disk():
        store.open_queue(name, durable=True)
    store.finish_recovery()
    assert not [r for r in caplog.records if "recovering" in r.getMessage()], "a small backlog says nothing"
    store.close()
