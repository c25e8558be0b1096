"""The retained messages' file on its own: replayed at open, a torn last record dropped, rewritten
when it holds mostly replaced records."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from lavinpy.mqtt import retained
from lavinpy.mqtt.retained import FILE_NAME, RetainedStore


class _VHost:
    """The two members of a vhost the store reads (hashable and weakly referenced, as a VHost)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.config = SimpleNamespace(fsync="always")


def _vhost(path: Path) -> Any:
    return _VHost(path)


def test_replay_and_torn_tail(tmp_path: Path) -> None:
    vhost = _vhost(tmp_path)
    store = RetainedStore()
    store.put(vhost, "a/b", b"one", 1)
    store.put(vhost, "a/c", b"two", 0)
    store.put(vhost, "a/c", b"", 0)
    whole = (tmp_path / FILE_NAME).stat().st_size
    with open(tmp_path / FILE_NAME, "ab") as f:
        f.write(b"R\x00\x03a/dX")  # a record cut short by a crash
    reopened = RetainedStore()
    assert reopened.matching(_vhost(tmp_path), "a/+") == [("a/b", b"one", 1)]
    assert (tmp_path / FILE_NAME).stat().st_size == whole  # the torn tail is cut off


def test_rewritten_when_mostly_replaced(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(retained, "COMPACT_MIN_BYTES", 1000)
    vhost = _vhost(tmp_path)
    store = RetainedStore()
    for i in range(200):
        store.put(vhost, "t", b"%03d" % i, 1)
    assert (tmp_path / FILE_NAME).stat().st_size < 1000 + 100
    assert RetainedStore().matching(_vhost(tmp_path), "#") == [("t", b"199", 1)]
