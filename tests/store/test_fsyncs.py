"""Several files fsynced at once: every descriptor is synced and its outcome reported in its place."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from lavinpy.store import fsyncs


def test_more_descriptors_than_one_compiled_call_takes(tmp_path: Path) -> None:
    count = fsyncs.FSYNC_ALL_MAX * 2 + 3
    fds = [os.open(tmp_path / f"f{i}", os.O_CREAT | os.O_RDWR) for i in range(count)]
    closed = os.open(tmp_path / "closed", os.O_CREAT | os.O_RDWR)
    os.close(closed)
    try:
        fds[fsyncs.FSYNC_ALL_MAX + 1] = closed  # in the second batch of a compiled run
        expected = [0] * count
        expected[fsyncs.FSYNC_ALL_MAX + 1] = errno.EBADF
        assert fsyncs.fsync_all(fds) == expected
        assert fsyncs.pool_fsync_all(fds) == expected
    finally:
        for fd in fds:
            if fd != closed:
                os.close(fd)


def test_fsync_together_raises_after_every_descriptor_ran(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fsyncs, "fsync_all", fsyncs.pool_fsync_all)  # through os.fsync, recorded here
    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    fds = [os.open(tmp_path / name, os.O_CREAT | os.O_RDWR) for name in "ab"]
    closed = os.open(tmp_path / "closed", os.O_CREAT | os.O_RDWR)
    os.close(closed)
    try:
        with pytest.raises(OSError) as raised:
            fsyncs.fsync_together([closed, *fds])
        assert raised.value.errno == errno.EBADF
        assert sorted(synced) == sorted([closed, *fds])
        fsyncs.fsync_together(fds[:1])  # one alone: in this thread
        assert synced[-1] == fds[0]
    finally:
        for fd in fds:
            os.close(fd)
