"""Opening a message store with many sealed segments leaves none of their pages mapped: reading each
sealed segment's tail for its valid end mapped 64 KiB of it, which with thousands of segments (a
20M-message backlog has about 3,000) was hundreds of MB of RSS during recovery."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lavinpy.store.message_store import MessageStore
from lavinpy.store.segment import segment_name
from lavinpy.wire.position import pos_segment

SMAPS = Path("/proc/self/smaps")


def mapped_kib(path: Path) -> dict[str, int]:
    """Rss (KiB) of each mapping of a file under ``path``, by file name."""
    out: dict[str, int] = {}
    current = None
    for line in SMAPS.read_text().splitlines():
        head = re.match(r"^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \S+\s+(.*)$", line)
        if head:
            name = head.group(1)
            current = Path(name).name if name.startswith(str(path)) else None
        elif current is not None and line.startswith("Rss:"):
            out[current] = out.get(current, 0) + int(line.split()[1])
    return out


@pytest.mark.skipif(not SMAPS.exists(), reason="needs /proc/self/smaps")
def test_sealed_segments_hold_no_pages_after_open(tmp_path: Path) -> None:
    store = MessageStore(tmp_path, 256 * 1024)
    store.open()
    body = bytes(range(256)) * 16
    segments = set()
    for i in range(600):  # about ten segments of 256 KiB
        pos = store.append("", "q", b"\x00\x00", body, i)
        store.incref(pos_segment(pos), 1)
        segments.add(pos_segment(pos))
    store.close()
    assert len(segments) >= 8
    store = MessageStore(tmp_path, 256 * 1024)
    store.open()
    try:
        rss = mapped_kib(tmp_path)
        newest = segment_name(max(segments))
        sealed = {name: kib for name, kib in rss.items() if name != newest}
        assert len(sealed) == len(segments) - 1
        assert sum(sealed.values()) == 0, sealed
        assert store.read(pos).body == body  # the data is still there, read back through the page cache
    finally:
        store.close()
