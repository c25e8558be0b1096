"""A follower's segment files: a streamed removal frees the name at once and the blocks in the store's
removal thread; a removal cut short by a stop is finished by the next applier; a batch's new files and
their directories are durable when it is committed (one fsync_all call covers both)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from lavinpy.cluster import file_applier
from lavinpy.cluster import replication_protocol as proto
from lavinpy.cluster.file_applier import FileApplier, apply_batch
from lavinpy.store.segment_files import removed_path

SEGMENT = "vh/msgs.0000000001"


def op(kind: int, path: str, *, offset: int = 0, size: int = 0, data: bytes = b"") -> proto.Operation:
    return proto.Operation(0, kind, path, offset=offset, size=size, data=data)


def wait_gone(path: Path) -> bool:
    deadline = time.monotonic() + 10
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return not path.exists()


def test_a_streamed_segment_removal_frees_its_name_at_once_and_its_file_later(tmp_path: Path) -> None:
    applier = FileApplier(tmp_path)
    apply_batch(applier, [op(proto.OP_TRUNCATE, SEGMENT, size=1 << 20),
                          op(proto.OP_WRITE, SEGMENT, offset=0, data=b"x" * 4096)])
    segment = tmp_path / SEGMENT
    assert segment.stat().st_size == 1 << 20
    apply_batch(applier, [op(proto.OP_DELETE, SEGMENT)])
    assert not segment.exists()
    assert wait_gone(removed_path(segment))
    # The same name can be written again at once (a new file, not the one being removed).
    apply_batch(applier, [op(proto.OP_WRITE, SEGMENT, offset=0, data=b"new")])
    assert segment.read_bytes() == b"new"
    assert sorted(p.name for p in segment.parent.iterdir()) == [segment.name]
    applier.close_files()


def test_other_removals_and_full_sync_deletions_stay_synchronous(tmp_path: Path) -> None:
    applier = FileApplier(tmp_path)
    apply_batch(applier, [op(proto.OP_WRITE, "vh/q/enq", data=b"e" * 16),
                          op(proto.OP_WRITE, "stale/msgs.0000000001", data=b"s")])
    apply_batch(applier, [op(proto.OP_DELETE, "vh/q/enq")])
    assert not (tmp_path / "vh").exists()  # removed at once, with the directories it emptied
    applier.delete("stale/msgs.0000000001")  # a full sync's deletion empties and removes its directory
    applier.commit()
    assert not (tmp_path / "stale").exists()
    applier.close_files()


def test_a_removal_cut_short_is_finished_by_the_next_applier(tmp_path: Path) -> None:
    leftover = removed_path(tmp_path / SEGMENT)
    leftover.parent.mkdir(parents=True)
    leftover.write_bytes(b"old")
    kept = tmp_path / "vh" / "msgs.0000000002"
    kept.write_bytes(b"kept")
    FileApplier(tmp_path).close_files()
    assert not leftover.exists()
    assert kept.read_bytes() == b"kept"


@pytest.mark.parametrize("sync", ["compiled", "pool"])
def test_new_files_and_their_directories_are_synced_by_the_commit(tmp_path: Path, sync: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    if sync == "compiled" and file_applier.cstore is None:
        pytest.skip("the pure-Python path is selected")
    if sync == "pool":
        monkeypatch.setattr(file_applier, "fsync_all", file_applier.pool_fsync_all)
    synced: list[str] = []
    real_fsync_all = file_applier.fsync_all

    def recording(fds: list[int]) -> list[int]:
        synced.extend(os.readlink(f"/proc/self/fd/{fd}") for fd in fds)
        return real_fsync_all(fds)

    monkeypatch.setattr(file_applier, "fsync_all", recording)
    applier = FileApplier(tmp_path)
    apply_batch(applier, [op(proto.OP_TRUNCATE, SEGMENT, size=4096), op(proto.OP_WRITE, "vh/q/enq", data=b"e")])
    root = tmp_path.resolve()
    assert sorted(synced) == sorted(str(p) for p in (root, root / "vh", root / "vh" / "q", root / SEGMENT,
                                                     root / "vh" / "q" / "enq"))
    applier.close_files()
