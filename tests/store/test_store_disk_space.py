"""Disk space is given back: after everything is acked only the current segment and the indexes stay."""

from __future__ import annotations

import asyncio
from pathlib import Path

from lavinpy.store.message_store import DEFAULT_SEGMENT_SIZE
from lavinpy.store.vhost_store import VhostStore

TOTAL_BYTES = 50 * 1024 * 1024
BODY = 1024


def directory_bytes(path: Path) -> dict[str, int]:
    """Allocated bytes per file (st_blocks, so sparse or preallocated files count as they are)."""
    return {str(p.relative_to(path)): p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file()}


def mapped_deleted_segments() -> list[str]:
    """Segment files still mapped by this process although deleted (they would keep their space)."""
    with open("/proc/self/maps") as f:
        return [line for line in f if "msgs." in line and "(deleted)" in line]


async def publish_and_consume(path: Path) -> None:
    store = VhostStore(path, fsync="always")
    store.open()
    queues = [store.open_queue(f"q{i}", durable=True) for i in range(3)]
    store.finish_recovery()
    body = bytes(range(256)) * (BODY // 256)
    count = TOTAL_BYTES // BODY
    for i in range(count):
        pos = store.messages.append("amq.fanout", "", b"\x00\x00", body)
        for q in queues:
            q.push(pos)
        if i % 1000 == 999:
            await store.flush()
    await store.flush()
    assert len(store.messages.segment_ids()) >= 6  # 50 MiB went through several segments
    for q in queues:
        while (pos := q.shift()) is not None:
            q.ack(pos)
    await store.flush()
    store.messages.settle_removals()  # emptied segments are unlinked by a worker thread

    files = directory_bytes(path)
    segments = {name: size for name, size in files.items() if name.startswith("msgs.")}
    assert len(segments) == 1, segments
    assert sum(segments.values()) <= DEFAULT_SEGMENT_SIZE
    index_bytes = sum(size for name, size in files.items() if not name.startswith("msgs."))
    assert sum(files.values()) <= DEFAULT_SEGMENT_SIZE + index_bytes
    assert index_bytes < 3 * 2 * 8 * count + 64 * 1024  # at most enq + ack per queue
    assert not mapped_deleted_segments()
    store.close()
    # a clean close compacts the indexes: the directory is now one segment and near-empty indexes
    files = directory_bytes(path)
    assert sum(size for name, size in files.items() if not name.startswith("msgs.")) <= 64 * 1024


def test_acked_messages_free_their_segments(tmp_path: Path) -> None:
    asyncio.run(publish_and_consume(tmp_path / "vhost"))
