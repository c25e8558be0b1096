"""A leader's flush reaches a follower as one batch: the leader hands the flush's operations to the
writer thread in one write, and a follower takes in what arrived while it wrote a read's operations
before it fsyncs and acknowledges (the index entries sent just behind a flush's segment bytes were
often read, fsynced and acknowledged on their own, a second fsync and round trip for that flush)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lavinpy.cluster import replica_state, replication_client
from lavinpy.cluster import replication_protocol as proto
from lavinpy.cluster.file_applier import FileApplier
from lavinpy.cluster.replication_client import ReplicationClient
from lavinpy.cluster.replication_server import ReplicationServer, _Follower

SEGMENT = "vh/msgs.0000000001"
INDEX = "vh/q/enq"


def frames_of(*encoded: bytes) -> list[tuple[int, bytes]]:
    return proto.FrameDecoder().feed(b"".join(encoded))


class ArrivedLink:
    """A follower's link whose reads have all arrived already, one list of frames per read."""

    def __init__(self, reads: list[list[tuple[int, bytes]]]) -> None:
        self.reads = reads
        self.sent: list[bytes] = []

    def frames(self) -> list[tuple[int, bytes]] | None:
        return self.reads.pop(0) if self.reads else None

    def frames_ready(self) -> list[tuple[int, bytes]]:
        return self.reads.pop(0) if self.reads else []

    def send(self, data: bytes) -> None:
        self.sent.append(data)


def stream(tmp_path: Path, reads: list[list[tuple[int, bytes]]]) -> tuple[list[int], int]:
    """Run the follower's stream over ``reads``: the acknowledged offsets and the number of commits."""
    applier = FileApplier(tmp_path / "follower")
    commits = 0
    commit = applier.commit

    def counted(everything: bool = False) -> None:
        nonlocal commits
        commits += 1
        commit(everything)

    applier.commit = counted  # type: ignore[method-assign]
    client = ReplicationClient(tmp_path / "follower", b"s", "f1", "127.0.0.1", 1)
    link = ArrivedLink(reads)
    try:
        client._stream(link, applier)  # type: ignore[arg-type]
        streamed = commits
    finally:
        applier.abort()
    acked = [proto.unpack_u64(payload) for kind, payload in proto.FrameDecoder().feed(b"".join(link.sent))
             if kind == proto.ACK]
    return acked, streamed


def a_flush() -> tuple[list[tuple[int, bytes]], list[tuple[int, bytes]], int]:
    """A flush's two reads: the segment bytes, then the index entry; and the stream's end after it."""
    segment = proto.op(100, proto.OP_WRITE, SEGMENT, data=b"m" * 64)
    index = proto.op(200, proto.OP_WRITE, INDEX, data=b"e" * 8)
    return frames_of(segment), frames_of(index), 200


def test_what_arrived_while_a_read_was_written_joins_its_fsync(tmp_path: Path) -> None:
    segment, index, end = a_flush()
    acked, commits = stream(tmp_path, [segment, index])
    assert (commits, acked) == (1, [end])
    assert (tmp_path / "follower" / SEGMENT).read_bytes() == b"m" * 64
    assert (tmp_path / "follower" / INDEX).read_bytes() == b"e" * 8


def test_a_batch_takes_in_no_more_than_its_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replication_client, "DRAIN_BYTES", 64)  # the first read fills it
    segment, index, end = a_flush()
    acked, commits = stream(tmp_path, [segment, index])
    assert (commits, acked) == (2, [100, end])


def test_an_epoch_stamp_read_with_a_later_read_is_recorded_after_the_fsync(tmp_path: Path) -> None:
    segment, index, _ = a_flush()
    stamp = frames_of(proto.op(250, proto.OP_EPOCH, "", data=proto.pack_u64(7)))
    acked, commits = stream(tmp_path, [segment, index + stamp])
    assert (commits, acked) == (1, [250])
    state = replica_state.read(tmp_path / "follower")
    assert state is not None and state.epoch == 7


class RecordingWriter:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.writes.append(bytes(data))
        return len(data)

    def buffered(self) -> int:
        return 0


def test_a_flush_goes_to_the_writer_thread_in_one_write(tmp_path: Path) -> None:
    server = ReplicationServer(tmp_path, b"s", "leader", None, "127.0.0.1", 0)  # type: ignore[arg-type]
    follower = _Follower("f1", "127.0.0.1:1", None, 0)  # type: ignore[arg-type]
    follower.thread_writer = writer = RecordingWriter()
    operations = [proto.op(100, proto.OP_WRITE, SEGMENT, data=b"m" * 64),
                  proto.op(200, proto.OP_WRITE, INDEX, data=b"e" * 8)]
    follower.queue.extend(operations)
    follower.queued_bytes = sum(map(len, operations))
    server._write_queued(follower)
    assert writer.writes == [b"".join(operations)]
    assert (follower.sent, follower.queued_bytes, len(follower.queue)) == (len(writer.writes[0]), 0, 0)
