"""A stream's delivery run framed with its offsets stamped in place (``writer.deliver_stamped_run``, compiled
in _cwire_stamped.c) gives the bytes of stamping the run first and framing it with ``writer.deliver_run``:
compiled and pure, cold and warm caches, blocks without a splice yet, bodies that need the general framing.
"""

from __future__ import annotations

import pytest
from pamqp import commands

from lavinpy.broker.queues import stream as stream_queue
from lavinpy.store.record import StoredMessage
from lavinpy.wire import accel, writer
from lavinpy.wire.properties import encode_properties

FRAME_MAX = 4096
BLOCKS = [
    encode_properties(commands.Basic.Properties(delivery_mode=2)),
    encode_properties(commands.Basic.Properties(headers={"a": 1, "x-stream-offset": "x"}, content_type="text/plain")),
    b"\x00\x00",
    encode_properties(commands.Basic.Properties(headers={"n": {"deep": [1, 2]}})),
]


def run_of(count: int) -> list[StoredMessage]:
    bodies = [b"", b"x" * (FRAME_MAX - 8), b"y" * (FRAME_MAX * 2)]  # empty, the largest one frame takes, split
    return [StoredMessage(i, "ex" if i % 5 else "", f"rk{i % 3}", BLOCKS[(i // 3) % len(BLOCKS)],
                          bodies[i // 7 % 3] if i % 7 == 6 else b"body%d" % i) for i in range(count)]


def old_way(messages: list[StoredMessage], first_tag: int, first_offset: int) -> bytes:
    stamped = stream_queue.stamped_run(messages, first_offset)
    return b"".join(writer.deliver_run_py(3, "ctag", first_tag, None, stamped, FRAME_MAX))


def stamped_way(deliver_stamped_run: object, messages: list[StoredMessage], first_tag: int, first_offset: int) -> bytes:
    frames, done = deliver_stamped_run(3, "ctag", first_tag, messages, FRAME_MAX, first_offset,  # type: ignore[operator]
                                       stream_queue._SPLICES)
    assert 0 <= done <= len(messages)
    rest = stream_queue.stamped_run(messages[done:], first_offset + done)
    return b"".join(frames) + b"".join(writer.deliver_run(3, "ctag", first_tag + done, None, rest, FRAME_MAX))


PATHS = [pytest.param(writer.deliver_stamped_run_py, id="pure")]
if accel.load("lavinpy.wire._cwire") is not None and writer.deliver_stamped_run is not writer.deliver_stamped_run_py:
    PATHS.append(pytest.param(writer.deliver_stamped_run, id="compiled"))


@pytest.mark.parametrize("deliver_stamped_run", PATHS)
@pytest.mark.parametrize("first_offset", [1, 2**62, -5])
def test_stamped_frames_match_stamping_then_framing(deliver_stamped_run: object, first_offset: int) -> None:
    messages = run_of(60)
    for cold in (True, False):
        if cold:  # no block has a splice yet and no deliver parts are cached
            stream_queue._SPLICES.clear()
            writer._deliver_parts_cache.clear()
        expected = old_way(messages, 17, first_offset)
        assert stamped_way(deliver_stamped_run, messages, 17, first_offset) == expected
        assert stamped_way(deliver_stamped_run, messages[6:], 23, first_offset + 6) == old_way(
            messages[6:], 23, first_offset + 6)


@pytest.mark.parametrize("deliver_stamped_run", PATHS)
def test_stops_at_the_first_block_without_a_splice(deliver_stamped_run: object) -> None:
    messages = [StoredMessage(i, "", "q", BLOCKS[0] if i < 4 else BLOCKS[3], b"m%d" % i) for i in range(8)]
    stream_queue._SPLICES.clear()
    writer.deliver_run_py(1, "t", 1, None, messages[:1], FRAME_MAX)  # the parts of ("", "q") cached
    stream_queue.with_stream_offset(BLOCKS[0], 1)  # only the first block's splice
    frames, done = deliver_stamped_run(1, "t", 5, messages, FRAME_MAX, 9, stream_queue._SPLICES)  # type: ignore[operator]
    assert done == 4
    stamped = stream_queue.stamped_run(messages[:4], 9)
    assert b"".join(frames) == b"".join(writer.deliver_run_py(1, "t", 5, None, stamped, FRAME_MAX))
    assert deliver_stamped_run(1, "t", 5, [], FRAME_MAX, 9, stream_queue._SPLICES) == ([], 0)  # type: ignore[operator]
