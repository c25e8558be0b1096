"""The compiled store's CRC-32 is zlib's on both of its paths (carry-less multiply folding where the
CPU has it, tables elsewhere): records written by one path are read by the other and by the
pure-Python store, so a single differing bit would make every record look damaged."""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lavinpy.store import record

cstore = pytest.importorskip("lavinpy.store._cstore")
PATHS = ["table", "clmul"] if cstore.crc32_path() == "clmul" else ["table"]


@pytest.fixture(params=PATHS)
def crc_path(request: pytest.FixtureRequest) -> Iterator[str]:
    cstore.crc32_path(request.param == "table")
    assert cstore.crc32_path() == request.param
    yield request.param
    cstore.crc32_path(False)


def test_every_length_and_alignment(crc_path: str) -> None:
    data = os.urandom(1200)
    for start in (0, 1, 3, 7, 8, 15):
        for length in range(0, 1100 - start, 1 if start == 0 else 7):
            piece = data[start:start + length]
            assert cstore.crc32(piece, 0) == zlib.crc32(piece), (crc_path, start, length)


def test_continues_a_running_crc(crc_path: str) -> None:
    data = os.urandom((1 << 20) + 37)
    expected = zlib.crc32(data)
    assert cstore.crc32(data) == expected
    running = 0
    for start in range(0, len(data), 65_537):  # uneven pieces: each continues the last one's value
        running = cstore.crc32(data[start:start + 65_537], running)
    assert running == expected


@given(st.binary(min_size=60, max_size=4000), st.integers(0, (1 << 32) - 1))
def test_fast_path_matches_zlib(data: bytes, value: int) -> None:
    assert cstore.crc32(data, value) == zlib.crc32(data, value)


def test_records_written_compiled_read_in_python(crc_path: str) -> None:
    names = record.encode_names(b"amq.direct", b"key")
    bodies = [os.urandom(n) for n in (0, 15, 16, 63, 64, 65, 1024, 5000)]
    buf = bytearray(20_000)
    done, end, packed, _, _ = cstore.write_run(buf, 0, len(buf), 1, names, b"\x00\x00", bodies, 0, 1234)
    assert done == len(bodies)
    offset = 0
    for body in bodies:
        msg, size = record.py_read_record(memoryview(buf), offset, end)  # verifies with zlib.crc32
        assert msg.body == body
        offset += size
