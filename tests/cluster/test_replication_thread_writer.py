"""A streaming follower's operations go through a writer thread (compiled build, plain TCP) or the
event loop's transport (pure Python): the follower gets the same bytes either way, in order, also when
the stream outruns the socket (the sender waits for the thread's backlog to drain)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from lavinpy.cluster import replication_server
from lavinpy.cluster.replication_client import ReplicationClient

from .replication_harness import SECRET
from .test_replication_protocol import _leader

pytestmark = [pytest.mark.timeout(60), pytest.mark.both_paths]

CHUNK = 256 * 1024  # past the writer's inline limit: the thread sends it
CHUNKS = 24  # 6 MiB, queued in one turn: well past the high-water marks, so the sender waits on the backlog


def test_the_stream_reaches_the_follower_whole_and_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replication_server, "WRITER_HIGH_WATER", 1024 * 1024)
    async def run() -> tuple[bytes, bool]:
        server, broker, isr = await _leader(tmp_path)
        client = ReplicationClient(tmp_path / "follower", SECRET, "f1", "127.0.0.1", server.port)
        task = asyncio.ensure_future(client.run())
        try:
            for _ in range(200):
                if isr.members == ["leader", "f1"]:
                    break
                await asyncio.sleep(0.05)
            assert isr.members == ["leader", "f1"]
            blob = os.urandom(CHUNK * CHUNKS)
            for i in range(CHUNKS):
                # overlapping rewrites: a frame sent out of order or twice would leave other bytes
                server.file_appended("blob/data", i * CHUNK // 2, blob[i * CHUNK:(i + 1) * CHUNK])
            await server.wait_replicated()
            [follower] = server._followers.values()
            threaded = follower.thread_writer is not None
        finally:
            await client.close()
            await task
            await server.stop()
            broker.close()
        expected = bytearray()
        for i in range(CHUNKS):
            start = i * CHUNK // 2
            expected[start:start + CHUNK] = blob[i * CHUNK:(i + 1) * CHUNK]
        assert (tmp_path / "follower" / "blob" / "data").read_bytes() == bytes(expected)
        return bytes(expected), threaded

    _, threaded = asyncio.run(run())
    assert threaded == replication_server.THREAD_WRITER
