"""Segments made ahead and removed in worker threads (store/segment_files.py), on real files."""

from __future__ import annotations

import time
from pathlib import Path

from lavinpy.store.message_store import MessageStore
from lavinpy.store.segment import segment_name
from lavinpy.wire.position import pos_segment

PROPS = b"\x10\x00\x02"


def prepared(path: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in path.glob(".msgs.*.tmp")}


def wait_prepared(path: Path, name: str, size: int) -> None:
    deadline = time.monotonic() + 10
    while prepared(path).get(name) != size:
        assert time.monotonic() < deadline, prepared(path)
        time.sleep(0.01)


def open_store(path: Path, segment_size: int) -> MessageStore:
    store = MessageStore(path, segment_size)
    store.open()
    store.delete_unreferenced()
    return store


def test_next_segment_made_ahead_and_taken_at_the_roll(tmp_path: Path) -> None:
    size = 4 << 20
    store = open_store(tmp_path, size)
    body = bytes(range(256)) * 256  # 64 KiB
    positions = []
    while len(positions) * len(body) <= size // 2 + len(body):  # just past half, well before the roll
        positions.append(store.append("e", "k", PROPS, body))
        store.incref(1)
    assert store.current_segment_id == 1  # the next one is made ahead once half of this one is written
    wait_prepared(tmp_path, "." + segment_name(2) + ".tmp", size)
    assert not (tmp_path / segment_name(2)).exists()  # not a segment until the roll
    while store.current_segment_id == 1:
        positions.append(store.append("e", "k", PROPS, body))
        store.incref(pos_segment(positions[-1]))
    assert (tmp_path / segment_name(2)).stat().st_size == size
    assert not any(name.endswith(segment_name(2) + ".tmp") for name in prepared(tmp_path))
    ranges = store.take_dirty()
    new = next(seg for seg, _, _ in ranges if seg.id == 2)
    assert new.name_unsynced  # its directory entry goes with its first sync
    store.sync_ranges(ranges)
    assert not new.name_unsynced
    assert all(store.read(p).body == body for p in positions)
    store.close()
    assert not prepared(tmp_path)  # an unused one does not outlive a clean close
    reopened = MessageStore(tmp_path, size)  # still recovering: nothing deleted for want of references
    reopened.open()
    assert all(reopened.read(p).body == body for p in positions)
    reopened.close()


def test_same_size_big_bodies_take_segments_made_ahead_others_keep_the_layout(tmp_path: Path) -> None:
    seg = 4096
    store = open_store(tmp_path, seg)
    big = bytes(16 << 10)
    first = store.append("e", "k", PROPS, big)
    store.incref(pos_segment(first))
    big_size = (tmp_path / segment_name(pos_segment(first))).stat().st_size
    wait_prepared(tmp_path, "." + segment_name(pos_segment(first) + 1) + ".tmp", big_size)
    second = store.append("e", "k", PROPS, big)  # the same size: the one made ahead
    store.incref(pos_segment(second))
    assert pos_segment(second) == pos_segment(first) + 1
    assert (tmp_path / segment_name(pos_segment(second))).stat().st_size == big_size
    small = store.append("e", "k", PROPS, b"small")  # a regular segment, as without making ahead
    store.incref(pos_segment(small))
    assert pos_segment(small) == pos_segment(second) + 1
    assert (tmp_path / segment_name(pos_segment(small))).stat().st_size == seg
    other = store.append("e", "k", PROPS, bytes(20 << 10))  # another size: sized to fit on the loop
    assert (tmp_path / segment_name(pos_segment(other))).stat().st_size > big_size
    store.settle_removals()
    store.close()
    assert not prepared(tmp_path)
    assert sorted(p.name for p in tmp_path.glob("msgs.*")) == [
        segment_name(i) for i in range(2, pos_segment(other) + 1)]  # 1 was empty


def test_deleted_segment_leaves_the_books_at_once_and_the_disk_after(tmp_path: Path) -> None:
    store = open_store(tmp_path, 4096)
    first = store.append("e", "k", PROPS, b"x" * 1000)
    store.incref(pos_segment(first))
    while store.current_segment_id == pos_segment(first):
        store.append("e", "k", PROPS, b"y" * 1000)
    disk = store.disk_bytes()
    store.decref(pos_segment(first))
    assert pos_segment(first) not in store.segment_ids()
    assert store.disk_bytes() == disk - 4096
    store.settle_removals()
    assert not (tmp_path / segment_name(pos_segment(first))).exists()
    store.close()


def test_leftover_made_ahead_segment_removed_at_open(tmp_path: Path) -> None:
    store = open_store(tmp_path, 4096)
    pos = store.append("e", "k", PROPS, b"kept")
    store.incref(pos_segment(pos))
    store.close()
    leftover = tmp_path / ("." + segment_name(2) + ".tmp")  # as a process killed before its roll leaves it
    leftover.write_bytes(b"\x01\x00\x00\x00" + bytes(4092))
    store = MessageStore(tmp_path, 4096)
    store.open()
    assert not leftover.exists()
    assert store.segment_ids() == [1]
    assert store.read(pos).body == b"kept"
    store.close()
