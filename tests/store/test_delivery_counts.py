"""DeliveryCounts: the per-queue delivery_counts file (append, reload, compaction, torn tail) and its
place in the vhost store (opened with the queue, synced by flushes, compacted after the index)."""

from __future__ import annotations

import asyncio
import os
from functools import partial
from pathlib import Path

import pytest

from lavinpy.store.datadir import sha1_name
from lavinpy.store.delivery_counts import COUNTS_FILE, ENTRY, DeliveryCounts, pack_entry
from lavinpy.store.vhost_store import VhostStore
from tests import helpers

P1, P2, P3 = 1 | (4 << 32), 1 | (100 << 32), 2 | (4 << 32)


def entries(path: Path) -> list[tuple[int, int]]:
    return [(pos, count) for pos, count, _ in ENTRY.iter_unpack(path.read_bytes())]


def reopen(directory: Path, live=None) -> DeliveryCounts:
    counts = DeliveryCounts("q", directory)
    counts.open(live)
    return counts


def test_append_and_reload_last_entry_wins(tmp_path: Path) -> None:
    counts = reopen(tmp_path)
    assert not (tmp_path / COUNTS_FILE).exists()  # nothing returned yet: no file
    counts.set(P1, 1)
    counts.set(P2, 1)
    counts.set(P1, 2)
    # each count is in the file as soon as set() returns (a killed process keeps it)
    assert entries(tmp_path / COUNTS_FILE) == [(P1, 1), (P2, 1), (P1, 2)]
    counts.close(clean=False)
    assert reopen(tmp_path).counts == {P1: 2, P2: 1}


def test_reload_keeps_only_messages_still_in_the_queue(tmp_path: Path) -> None:
    counts = reopen(tmp_path)
    for pos in (P1, P2, P3):
        counts.set(pos, 3)
    counts.close(clean=False)
    assert reopen(tmp_path, live=iter([P3, P1, 12345])).counts == {P1: 3, P3: 3}


def test_torn_tail_and_damaged_entries_are_ignored(tmp_path: Path) -> None:
    counts = reopen(tmp_path)
    counts.set(P1, 1)
    counts.set(P2, 5)
    counts.close(clean=False)
    path = tmp_path / COUNTS_FILE
    data = bytearray(path.read_bytes())
    data[ENTRY.size + 8] ^= 0x01  # P2's count flipped: its CRC no longer matches
    data += pack_entry(P3, 7)[:9]  # a write cut short by a crash
    path.write_bytes(bytes(data))
    counts = reopen(tmp_path)
    assert counts.counts == {P1: 1}
    assert path.stat().st_size == 2 * ENTRY.size  # the partial entry is cut off
    counts.set(P3, 2)  # later entries are whole entries again
    counts.close(clean=False)
    assert reopen(tmp_path).counts == {P1: 1, P3: 2}


def test_compaction_when_the_file_outgrows_the_counts(tmp_path: Path) -> None:
    synced: list[dict[int, int]] = []
    counts = DeliveryCounts("q", tmp_path, compact_min_entries=8,
                            sync_removals=lambda: synced.append(dict(counts.counts)))
    counts.open()
    path = tmp_path / COUNTS_FILE
    counts.set(P2, 1)
    for n in range(1, 30):
        counts.set(P1, n)
        counts.counts.pop(P2, None)  # P2 acked: forgotten in memory, still in the file
        assert path.stat().st_size <= 8 * ENTRY.size
    assert synced, "never compacted"
    assert entries(path)[-1] == (P1, 29)
    assert P2 not in dict(entries(path))  # dropped by the first compaction
    counts.close(clean=False)
    assert reopen(tmp_path).counts == {P1: 29}


def test_clean_close_compacts_or_removes_the_file(tmp_path: Path) -> None:
    counts = reopen(tmp_path)
    for n in range(1, 6):
        counts.set(P1, n)
    counts.set(P2, 1)
    counts.close()
    assert sorted(entries(tmp_path / COUNTS_FILE)) == [(P1, 5), (P2, 1)]
    counts = reopen(tmp_path)
    counts.counts.clear()  # every counted message left the queue
    counts.close()
    assert not (tmp_path / COUNTS_FILE).exists()
    assert not list(tmp_path.iterdir())


def test_transient_counts_have_no_file(tmp_path: Path) -> None:
    counts = DeliveryCounts("q", None)
    counts.open()
    counts.set(P1, 1)
    assert counts.counts == {P1: 1} and not counts.take_unsynced_fds()
    counts.close()


# --- in the vhost store ---------------------------------------------------------------------------

make_store = partial(helpers.make_store, segment_size=4096, fsync="always")


def publish(store: VhostStore, index, n: int) -> list[int]:
    out = []
    for i in range(n):
        pos = store.messages.append("", "q", b"\x00\x00", bytes([i]) * 16)
        index.push(pos)
        out.append(pos)
    return out


def test_store_reopens_counts_of_the_messages_left(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    index = store.open_queue("q", durable=True)
    counts = store.open_delivery_counts(index)
    assert store.open_delivery_counts(index) is counts
    a, b, c = publish(store, index, 3)
    store.finish_recovery()
    for pos in (a, b, c):
        assert index.shift() == pos
    counts.set(a, 1)
    counts.set(b, 2)
    index.requeue(b)
    index.requeue(a)
    assert index.shift() == a
    index.ack(a)
    counts.counts.pop(a)
    store.close(clean=False)  # as a crash leaves it: the ack of a was handed to the OS

    store = make_store(tmp_path)
    index = store.open_queue("q", durable=True)
    assert store.open_delivery_counts(index).counts == {b: 2}
    store.finish_recovery()
    store.close()
    assert entries(tmp_path / sha1_name("q") / COUNTS_FILE) == [(b, 2)]


def test_compaction_puts_acks_on_disk_before_dropping_counts(tmp_path: Path) -> None:
    """An ack still buffered when compaction drops its count is written and synced first."""
    store = make_store(tmp_path)
    index = store.open_queue("q", durable=True)
    counts = store.open_delivery_counts(index)
    [a] = publish(store, index, 1)
    store.finish_recovery()
    index.shift()
    counts.set(a, 1)
    index.ack(a)  # buffered in the index, not yet written
    counts.counts.pop(a)
    ack_file = tmp_path / sha1_name("q") / "ack"
    assert not ack_file.exists()  # made by the first ack written
    counts.compact()
    assert not (tmp_path / sha1_name("q") / COUNTS_FILE).exists()
    assert ack_file.read_bytes() == a.to_bytes(8, "little")
    store.close()


def test_flush_syncs_counts_and_delete_forgets_them(tmp_path: Path) -> None:
    async def main() -> None:
        store = make_store(tmp_path)
        index = store.open_queue("q", durable=True)
        counts = store.open_delivery_counts(index)
        [a] = publish(store, index, 1)
        store.finish_recovery()
        await store.flush()
        assert not store.pending
        index.shift()
        counts.set(a, 1)
        assert store.pending  # the periodic flush will fsync the counts file
        await store.flush()
        assert not store.pending and not counts.take_unsynced_fds()
        store.delete_queue(index)
        assert not (tmp_path / sha1_name("q")).exists()
        again = store.open_queue("q", durable=True)
        assert store.open_delivery_counts(again).counts == {}
        store.close()

    asyncio.run(main())


@pytest.mark.parametrize("size", [1, ENTRY.size - 1])
def test_file_of_only_a_torn_entry(tmp_path: Path, size: int) -> None:
    (tmp_path / COUNTS_FILE).write_bytes(os.urandom(size))
    counts = reopen(tmp_path)
    assert counts.counts == {}
    assert (tmp_path / COUNTS_FILE).stat().st_size == 0
