"""The scan of a run of fused publishes: the compiled ``_cpublish.scan_run`` and its pure-Python twin
``py_scan_run`` (lavinpy/amqp/publish_batch.py) take the same run from the same frames."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands

from lavinpy.amqp import publish_batch
from lavinpy.amqp.publish_batch import py_scan_run
from lavinpy.wire.frames import BodyFrame, ContentMessage

PLAIN = b"\x10\x00\x02"  # delivery_mode 2
OTHER = b"\x90\x00\x0atext/plain\x02"  # content_type + delivery_mode
EXPIRING = b"\x01\x00\x0360000"  # expiration: checked alone
USER_ID = b"\x00\x10\x05guest"  # user_id: checked alone
REPLY = b"\x02\x00\x15amq.rabbitmq.reply-to"  # direct reply-to: checked alone
SHORT = b"\x00"  # too short to read its flags: checked alone
BLOCKS = [PLAIN, OTHER, EXPIRING, USER_ID, REPLY, SHORT, b"\x10\x00\x01", b"\x00\x00"]
M1 = commands.Basic.Publish(exchange="", routing_key="q")
M2 = commands.Basic.Publish(exchange="", routing_key="q")  # equal but another object: ends a run

pytestmark = pytest.mark.both_paths  # the pure twin alone under LAVINPY_PURE_PYTHON=1

scans = [py_scan_run]
if publish_batch.cpublish is not None:
    scans.append(publish_batch.cpublish.scan_run)

frame = st.one_of(
    st.builds(ContentMessage, st.sampled_from([1, 1, 1, 2]), st.sampled_from([M1, M1, M1, M2]),
              st.sampled_from(BLOCKS), st.binary(max_size=12)),
    st.just(BodyFrame(1, b"x")))


def first_message(properties: bytes = PLAIN) -> ContentMessage:
    return ContentMessage(1, M1, properties, b"first")


@pytest.mark.parametrize("scan", scans)
def test_a_run_of_equal_publishes_is_taken_whole(scan) -> None:
    frames: list[object] = [first_message()] + [ContentMessage(1, M1, PLAIN, bytes([i])) for i in range(5)]
    assert scan(frames, 0, 100) == (6, [b"first", b"\x00", b"\x01", b"\x02", b"\x03", b"\x04"], None)


@pytest.mark.parametrize("scan", scans)
def test_differing_properties_come_back_one_block_per_body(scan) -> None:
    frames: list[object] = [first_message(), ContentMessage(1, M1, PLAIN, b"a"), ContentMessage(1, M1, OTHER, b"b"),
                            ContentMessage(1, M1, PLAIN, b"c")]
    assert scan(frames, 0, 100) == (4, [b"first", b"a", b"b", b"c"], [PLAIN, PLAIN, OTHER, PLAIN])


@pytest.mark.parametrize("scan", scans)
@pytest.mark.parametrize("stop", [
    ContentMessage(2, M1, PLAIN, b"b"),  # another channel
    ContentMessage(1, M2, PLAIN, b"b"),  # another publish method object
    ContentMessage(1, M1, PLAIN, b"x" * 101),  # a body over the limit
    ContentMessage(1, M1, EXPIRING, b"b"), ContentMessage(1, M1, USER_ID, b"b"), ContentMessage(1, M1, REPLY, b"b"),
    BodyFrame(1, b"b"),
])
def test_the_run_ends_before_a_frame_it_cannot_take(scan, stop: object) -> None:
    frames: list[object] = [first_message(), ContentMessage(1, M1, PLAIN, b"a"), stop,
                            ContentMessage(1, M1, PLAIN, b"c")]
    assert scan(frames, 0, 100) == (2, [b"first", b"a"], None)


@pytest.mark.skipif(publish_batch.cpublish is None, reason="the compiled scan is not loaded")
@given(st.lists(frame, max_size=12), st.integers(0, 3), st.integers(0, 14))
def test_the_compiled_scan_agrees_with_the_pure_one(tail: list[object], start: int, max_size: int) -> None:
    frames: list[object] = [BodyFrame(1, b"")] * start + [first_message()] + tail
    assert publish_batch.cpublish is not None
    assert publish_batch.cpublish.scan_run(frames, start, max_size) == py_scan_run(frames, start, max_size)


@pytest.mark.skipif(publish_batch.cpublish is None, reason="the compiled scan is not loaded")
def test_the_compiled_scan_refuses_a_start_that_is_not_a_fused_publish() -> None:
    assert publish_batch.cpublish is not None
    with pytest.raises(ValueError):
        publish_batch.cpublish.scan_run([BodyFrame(1, b"")], 0, 10)
