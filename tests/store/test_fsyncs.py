"""Several files fsynced at once: every descriptor is synced and its outcome reported in its place, whether
from a thread, the compiled workers, or the compiled workers started from the event loop."""

from __future__ import annotations

import asyncio
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


def _not_open() -> int:
    fd = 1000
    while True:
        try:
            os.fstat(fd)
        except OSError:
            return fd
        fd += 1


def _descriptors(tmp_path: Path) -> tuple[list[int], list[int], list[int]]:
    """Files, a closed descriptor (EBADF) and a pipe (EINVAL): (the batch, its expected errno values,
    what to close)."""
    files = [os.open(tmp_path / name, os.O_CREAT | os.O_RDWR) for name in "abc"]
    for fd in files:
        os.write(fd, b"x" * 100)
    read_end, write_end = os.pipe()
    closed = _not_open()  # not reused by the event loop's own descriptors meanwhile
    batch = [files[0], closed, files[1], read_end, files[2]]
    return batch, [0, errno.EBADF, 0, errno.EINVAL, 0], [*files, read_end, write_end]


@pytest.mark.skipif(not fsyncs.ON_LOOP, reason="needs the compiled store")
def test_loop_fsyncs_report_as_the_thread_pool_does(tmp_path: Path) -> None:
    batch, expected, opened = _descriptors(tmp_path)

    async def scenario() -> None:
        loop_fsyncs = fsyncs.LoopFsyncs()
        for _ in range(3):  # one batch after the other, watched by the loop throughout
            called: asyncio.Future[tuple[list[int], float]] = asyncio.get_running_loop().create_future()
            loop_fsyncs.start(batch, lambda errors, seconds, called=called: called.set_result((errors, seconds)))
            assert loop_fsyncs.running
            errors, seconds = await called
            assert errors == expected == fsyncs.pool_fsync_all(batch)
            assert seconds >= 0 and not loop_fsyncs.running
            posted, started, finished = loop_fsyncs.last
            assert posted <= started <= finished
        loop_fsyncs.close()

    try:
        asyncio.run(scenario())
    finally:
        for fd in opened:
            os.close(fd)


@pytest.mark.skipif(not fsyncs.ON_LOOP, reason="needs the compiled store")
def test_loop_fsyncs_close_finishes_a_running_batch(tmp_path: Path) -> None:
    batch, expected, opened = _descriptors(tmp_path)
    reported: list[list[int]] = []

    async def scenario() -> None:
        loop_fsyncs = fsyncs.LoopFsyncs()
        loop_fsyncs.start(batch, lambda errors, seconds: reported.append(errors))
        with pytest.raises(RuntimeError):  # one batch at a time
            loop_fsyncs._starter.start(batch)
        loop_fsyncs.close()  # before the loop saw it: done is called here, once
        assert reported == [expected]
        assert not loop_fsyncs.running
        await asyncio.sleep(0.01)
        assert reported == [expected]

    try:
        asyncio.run(scenario())
    finally:
        for fd in opened:
            os.close(fd)
