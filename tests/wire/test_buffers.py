"""lavinpy.wire.buffers and the compiled receive: a receive buffer keeps its allocation while it is read
and emptied (drop_front, recv_append), with the same bytes as bytearray's own operations; a batch's
column buffers are handed out again only once nothing else holds them."""

from __future__ import annotations

import socket
import sys

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lavinpy.wire import accel, buffers
from tests.spark.delivery_frames import needs_compiled


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.lists(st.integers(min_value=0, max_value=400), max_size=6))
def test_drop_front_is_del_of_a_prefix(data: bytes, cuts: list[int]) -> None:
    buf, plain = bytearray(data), bytearray(data)
    for cut in cuts:
        cut = min(cut, len(plain))
        buffers.drop_front(buf, cut)
        del plain[:cut]
        assert buf == plain
        buf.extend(b"+")  # what follows a drop lands after the bytes left
        plain.extend(b"+")
        assert buf == plain


@needs_compiled
def test_a_buffer_emptied_read_after_read_keeps_its_allocation() -> None:
    buf = bytearray(1 << 20)
    alloc = buf.__alloc__()
    accel.cclient.drop_front(buf, len(buf) - 10)
    assert len(buf) == 10 and buf.__alloc__() == alloc
    accel.cclient.drop_front(buf, 10)
    assert buf == b"" and buf.__alloc__() == alloc
    plain = bytearray(1 << 20)
    del plain[:len(plain) - 10]
    assert plain.__alloc__() < alloc  # what bytearray does itself: the memory goes back


@needs_compiled
def test_drop_front_refuses_what_del_refuses() -> None:
    buf = bytearray(b"abcdef")
    with pytest.raises(ValueError, match="cannot drop 7 bytes of 6"):
        accel.cclient.drop_front(buf, 7)
    with pytest.raises(ValueError):
        accel.cclient.drop_front(buf, -1)
    view = memoryview(buf)
    with pytest.raises(BufferError):
        accel.cclient.drop_front(buf, 2)  # an exported buffer cannot move
    view.release()
    assert buf == b"abcdef"


@needs_compiled
def test_recv_append_reads_into_the_room_a_consumed_front_left() -> None:
    ours, theirs = socket.socketpair()
    try:
        buf = bytearray(b"x" * 5000 + b"tail")
        alloc = buf.__alloc__()
        accel.cclient.drop_front(buf, 5000)  # a parser took the front; "tail" is a partial frame
        theirs.sendall(b"y" * 3000)
        assert accel.cclient.recv_append(ours.fileno(), buf, 4000) == 3000
        assert buf == b"tail" + b"y" * 3000 and buf.__alloc__() == alloc  # moved to the start, not grown
        assert accel.cclient.recv_append(ours.fileno(), buf, 4000) == -1  # nothing there now
        assert buf == b"tail" + b"y" * 3000
        theirs.sendall(b"z" * 70000)
        got = 0
        while got < 70000:
            got += max(0, accel.cclient.recv_append(ours.fileno(), buf, 1 << 16))
        assert buf == b"tail" + b"y" * 3000 + b"z" * 70000  # grown where the room was too small
        view = memoryview(buf)
        with pytest.raises(BufferError):
            accel.cclient.recv_append(ours.fileno(), buf, 10)
        view.release()
        theirs.close()
        assert accel.cclient.recv_append(ours.fileno(), buf, 10) == 0  # the peer closed
    finally:
        ours.close()


def test_column_room_is_handed_out_again_only_once_arrow_lets_go(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(buffers, "_kept", [])  # none kept from other tests
    n = 1 << 20
    first = buffers.column_room(n)
    assert len(first) >= n
    first[:5] = b"batch"
    held = pa.py_buffer(first)  # a record batch's column holds its bytearray this way
    first_id = id(first)
    del first
    second = buffers.column_room(n)
    assert id(second) != first_id and bytes(held[:5]) == b"batch"  # still Arrow's: not handed out
    del held
    third = buffers.column_room(n)
    assert id(third) == first_id  # nobody holds it any longer: the same memory again
    assert buffers.column_room(n) is not third  # while `third` is held, another one


def test_column_room_keeps_a_bounded_amount(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(buffers, "_kept", [])
    small = buffers.column_room(1000)
    assert len(small) == 1000 and all(buf is not small for buf in buffers._kept)  # the allocator's business
    held = [buffers.column_room(1 << 20) for _ in range(40)]  # all in use: more than may be kept
    assert sum(len(buf) for buf in buffers._kept) <= buffers._KEPT_MAX_BYTES
    del held
    huge = buffers.column_room(buffers._KEPT_MAX_BYTES)  # too big to keep
    assert all(buf is not huge for buf in buffers._kept)
    assert sys.getrefcount(huge) == 2
