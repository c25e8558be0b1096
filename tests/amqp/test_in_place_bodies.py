"""Large bodies written straight into their record's place in a segment as their frames arrive
(amqp/content.py, store/reserved_record.py): read back whole, a body bigger than a segment in a
segment of its own, nothing visible of a body that never completed and its space skipped or
reclaimed on recovery, the size limit refused before any space is taken, transactions spooled."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pamqp import body, commands, header
from session_client import Client, Harness

from lavinpy.store.segment import segment_name
from lavinpy.wire.position import pos_offset, pos_segment

FRAME = 8192 - 8  # the body bytes of one frame at frame_max 8192


def start(path: Path, **settings: object) -> tuple[Harness, Client]:
    harness = Harness(path, frame_max=8192, **settings)
    client = harness.connect()
    client.handshake()
    client.open_channel(1)
    client.send((1, commands.Queue.Declare(queue="big", durable=True)))
    assert client.names() == [(1, "Queue.DeclareOk")]
    return harness, client


def payload(size: int, seed: int = 0) -> bytes:
    """Every 4 KiB block differs: a misplaced or repeated frame shows."""
    return b"".join(((i + seed) % 65521).to_bytes(4, "big") * 1024 for i in range(size // 4096 + 1))[:size]


def frames(data: bytes, routing_key: str = "big", **publish: object) -> list:
    """basic.publish, its header and the body cut into frames (persistent)."""
    props = commands.Basic.Properties(delivery_mode=2)
    return [(1, commands.Basic.Publish(exchange="", routing_key=routing_key, **publish)),
            (1, header.ContentHeader(0, len(data), props)),
            *[(1, body.ContentBody(data[i:i + FRAME])) for i in range(0, len(data), FRAME)]]


def get(client: Client, queue: str = "big") -> bytes | None:
    client.send((1, commands.Basic.Get(queue=queue, no_ack=True)))
    got = client.read()
    if got[0][1].name == "Basic.GetEmpty":
        return None
    assert got[0][1].name == "Basic.GetOk"
    return b"".join(f.value for _, f in got[2:])


def queue_positions(harness: Harness, queue: str = "big") -> list[int]:
    return list(harness.broker.vhosts["/"].queues[queue].index.ready_positions())


def test_body_in_many_frames_is_written_once_into_its_record(tmp_path: Path) -> None:
    harness, client = start(tmp_path)
    try:
        data = payload(300 * 1024)
        parts = frames(data)
        client.send(*parts[:10])
        content = client.conn.channels[1].content
        stored = content.stored
        assert stored is not None and stored.written == 8 * FRAME
        client.send(*parts[10:])
        assert content.stored is None
        assert client.conn._body_spool is None  # no spool file was needed
        [pos] = queue_positions(harness)
        assert pos == stored.position
        messages = harness.broker.vhosts["/"].store.messages
        assert messages.refcount(pos_segment(pos)) == 1  # the queue's; the reservation's is released
        raw = (messages.path / segment_name(pos_segment(pos))).read_bytes()
        at = raw.index(data[4096:8192], pos_offset(pos)) - 4096
        assert raw[at:at + len(data)] == data
        assert get(client) == data
    finally:
        harness.close()


def test_body_bigger_than_a_segment_gets_a_segment_of_its_own(tmp_path: Path) -> None:
    harness, client = start(tmp_path, segment_size=64 * 1024)
    try:
        small, big = payload(100), payload(200 * 1024, 1)
        client.send(*frames(small))
        client.send(*frames(big))
        client.send(*frames(small))
        positions = queue_positions(harness)
        segments = [pos_segment(p) for p in positions]
        assert len(set(segments)) == 3  # the big one alone in the middle one
        messages = harness.broker.vhosts["/"].store.messages
        assert messages._segments[segments[1]].size > 200 * 1024 > messages.segment_size
        assert [get(client), get(client), get(client)] == [small, big, small]
    finally:
        harness.close()


@pytest.mark.parametrize("then_publish", [True, False], ids=["followed", "at-the-tail"])
def test_connection_lost_mid_body_leaves_no_message_and_recovers_clean(
        tmp_path: Path, then_publish: bool, caplog: pytest.LogCaptureFixture) -> None:
    harness, client = start(tmp_path)
    data = payload(200 * 1024)
    parts = frames(data)
    client.send(*parts[:12])  # publish, header and 10 of its 26 body frames
    stored = client.conn.channels[1].content.stored
    assert stored is not None
    messages = harness.broker.vhosts["/"].store.messages
    client.conn.lost()  # the client's socket went away mid-body
    assert messages.refcount(pos_segment(stored.position)) == 0
    assert harness.broker.vhosts["/"].queues["big"].message_count == 0
    other = harness.connect()
    other.handshake()
    other.open_channel(1)
    after = payload(50 * 1024, 2)
    if then_publish:
        other.send(*frames(after))
    harness.close()  # written as it is: a crash leaves the same bytes in the file

    caplog.set_level(logging.WARNING, "lavinpy.store")
    harness = Harness(tmp_path, frame_max=8192)
    try:
        client = harness.connect()
        client.handshake()
        client.open_channel(1)
        assert get(client) == (after if then_publish else None)
        assert get(client) is None
        messages = harness.broker.vhosts["/"].store.messages
        if then_publish:  # stepped over by its length, the record after it kept
            assert "is incomplete; skipped" in caplog.text
        else:  # a torn tail: zeroed, the space written again
            assert messages._wpos == pos_offset(stored.position)
        client.send(*frames(data))
        assert get(client) == data
    finally:
        harness.close()


def test_body_longer_than_announced_closes_the_connection_and_releases_its_record(tmp_path: Path) -> None:
    harness, client = start(tmp_path)
    try:
        data = payload(100 * 1024)
        parts = frames(data)
        parts[1] = (1, header.ContentHeader(0, len(data) - 10, commands.Basic.Properties(delivery_mode=2)))
        client.send(*parts[:5])
        stored = client.conn.channels[1].content.stored
        assert stored is not None
        client.send(*parts[5:])
        [(channel, close)] = client.methods()
        assert (channel, close.name, close.reply_code) == (0, "Connection.Close", 501)
        client.conn.lost()
        messages = harness.broker.vhosts["/"].store.messages
        assert messages.refcount(pos_segment(stored.position)) == 0
        assert harness.broker.vhosts["/"].queues["big"].message_count == 0
    finally:
        harness.close()


def test_channel_closed_by_an_error_mid_body_releases_its_record(tmp_path: Path) -> None:
    harness, client = start(tmp_path)
    try:
        data = payload(100 * 1024)
        parts = frames(data)
        client.send(*parts[:5])
        stored = client.conn.channels[1].content.stored
        assert stored is not None
        # the broker closes the channel for a reason of its own (here: the channel's release, as on a
        # consumer timeout or a queue deleted under it): the body's record goes with it
        client.conn.channels[1].release()
        messages = harness.broker.vhosts["/"].store.messages
        assert messages.refcount(pos_segment(stored.position)) == 0
        assert harness.broker.vhosts["/"].queues["big"].message_count == 0
    finally:
        harness.close()


def test_body_over_max_message_size_is_refused_with_406_before_any_space_is_taken(tmp_path: Path) -> None:
    harness, client = start(tmp_path, max_message_size=64 * 1024)
    try:
        messages = harness.broker.vhosts["/"].store.messages
        wpos = messages._wpos
        client.send(*frames(payload(100 * 1024)))
        [(channel, close)] = client.methods()
        assert (channel, close.name, close.reply_code) == (1, "Channel.Close", 406)
        assert close.reply_text == ("PRECONDITION_FAILED - message size 102400 is larger than configured max "
                                    "size 65536")
        assert messages._wpos == wpos
        assert harness.broker.vhosts["/"].queues["big"].message_count == 0
    finally:
        harness.close()


def test_unroutable_mandatory_body_is_returned_whole(tmp_path: Path) -> None:
    harness, client = start(tmp_path)
    try:
        data = payload(100 * 1024, 3)
        client.send(*frames(data, routing_key="nowhere", mandatory=True))
        got = client.read()
        assert got[0][1].name == "Basic.Return"
        assert b"".join(f.value for _, f in got[2:]) == data
    finally:
        harness.close()


def test_transactional_body_is_spooled_until_commit(tmp_path: Path) -> None:
    harness, client = start(tmp_path)
    try:
        client.send((1, commands.Tx.Select()))
        assert client.names() == [(1, "Tx.SelectOk")]
        data = payload(100 * 1024, 4)
        parts = frames(data)
        client.send(*parts[:4])
        content = client.conn.channels[1].content
        assert content.stored is None and content.spooled is not None
        client.send(*parts[4:])
        assert harness.broker.vhosts["/"].queues["big"].message_count == 0  # until tx.commit
        [pending] = client.conn.channels[1].tx.publishes
        assert bytes(pending.body.read()) == data
    finally:
        harness.close()
