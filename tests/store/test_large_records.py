"""Large bodies in the message store: written the large way, read back as slices of the segment."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lavinpy.store.message_store import LARGE_BODY, LARGE_RUN, MessageStore
from lavinpy.store.record import CorruptRecord, encode_names, file_write_run, write_run
from lavinpy.store.segment import segment_name
from lavinpy.wire.position import pos_offset, pos_segment

MiB = 1024 * 1024
PROPS = b"\x10\x00\x02"  # delivery_mode = 2


def open_store(path: Path, segment_size: int = 8 * MiB) -> MessageStore:
    store = MessageStore(path, segment_size)
    store.open()
    store.delete_unreferenced()
    return store


# a body of 4 MiB or more is checked a piece at a time, its pages dropped from the mapping as it goes
@pytest.mark.parametrize("size", [LARGE_BODY + 12345, 5 * 1024 * 1024 + 12345], ids=["large", "checked-in-pieces"])
def test_large_body_round_trips_and_is_read_in_place(tmp_path: Path, size: int) -> None:
    store = open_store(tmp_path)
    body = os.urandom(size)
    small = store.append("ex", "key", PROPS, b"small", 1)
    pos = store.append("ex", "k\u00e9y", PROPS, memoryview(body), 2)
    store.incref(pos_segment(pos), 2)
    message = store.read(pos)
    assert (message.timestamp, message.exchange, message.routing_key, message.properties) == (
        2, "ex", "k\u00e9y", PROPS)
    assert type(message.body) is memoryview  # no copy in the heap
    assert message.body == body
    assert [m.body for m in store.read_many([small, pos, small])] == [b"small", body, b"small"]
    store.close()
    store = open_store(tmp_path)  # the CRC written the large way checks out on the compiled reader
    assert store.read(pos).body == body
    store.close()


@pytest.mark.parametrize("size, damage_at", [(LARGE_BODY, 100_000), (5 * 1024 * 1024, 3_500_123)],
                         ids=["large", "checked-in-pieces"])
def test_large_body_damage_is_caught(tmp_path: Path, size: int, damage_at: int) -> None:
    store = open_store(tmp_path)
    body = bytes(size)
    pos = store.append("e", "k", PROPS, body)
    after = store.append("e", "k", PROPS, b"after")  # so the damage is not a torn tail
    store.close()
    path = tmp_path / segment_name(pos_segment(pos))
    with open(path, "r+b") as f:
        f.seek(pos_offset(pos) + damage_at)
        f.write(b"\x01")
    store = open_store(tmp_path)
    with pytest.raises(CorruptRecord, match=segment_name(pos_segment(pos))):
        store.read(pos)
    with pytest.raises(CorruptRecord):
        store.read_many([after, pos])
    assert store.read(after).body == b"after"
    store.close()


def test_run_of_large_bodies(tmp_path: Path) -> None:
    store = open_store(tmp_path, 1 * MiB)
    bodies = [bytes([i]) * LARGE_RUN for i in range(40)]  # 2.5 MiB: the run spans segments
    positions: list[int] = []
    start = 0
    while start < len(bodies):
        start, written, *_ = store.append_run("e", "k", PROPS, bodies, start, 7)
        positions += written
        for p in written:
            store.incref(pos_segment(p))
    assert len(positions) == len(bodies)
    assert [m.body for m in store.read_many(positions)] == bodies
    store.close()


def test_body_larger_than_a_segment_outlives_its_deleted_segment(tmp_path: Path) -> None:
    store = open_store(tmp_path, 1 * MiB)
    body = os.urandom(3 * MiB)
    pos = store.append("e", "k", PROPS, body)
    store.incref(pos_segment(pos))
    after = store.append("e", "k", PROPS, b"after")  # the oversized segment is sealed
    store.incref(pos_segment(after))
    held = store.read(pos).body  # as a delivery in progress holds it
    path = tmp_path / segment_name(pos_segment(pos))
    assert path.stat().st_size < 3 * MiB + 4096
    store.decref(pos_segment(pos))  # acknowledged (no-ack consumer): the segment goes
    store.settle_removals()  # unlinked by a worker thread
    assert not path.exists()
    assert held == body  # the slice keeps its mapping
    store.close()  # closing with a slice alive is not an error either
    assert held == body


@pytest.mark.parametrize("varied", [False, True], ids=["one-properties", "properties-each"])
def test_run_written_into_the_file_is_the_run_written_into_a_mapping(tmp_path: Path, varied: bool) -> None:
    names = encode_names(b"ex", b"key")
    bodies = [bytes([i]) * (LARGE_RUN + i) for i in range(5)] + [b"small"]
    properties: bytes | list[bytes] = [PROPS + bytes([i]) for i in range(6)] if varied else PROPS
    limit = 64 + 3 * (LARGE_RUN + 64)  # room for three of the large bodies
    mapped = bytearray(limit)
    expected = write_run(mapped, 16, limit, 3, names, properties, bodies, 1, 42)
    path = tmp_path / "segment"
    path.write_bytes(bytes(limit))
    fd = os.open(path, os.O_RDWR)
    try:
        assert file_write_run(fd, 16, limit, 3, names, properties, bodies, 1, 42) == expected
    finally:
        os.close(fd)
    assert expected[0] == 4  # bodies 1 to 3 written
    assert path.read_bytes() == mapped
