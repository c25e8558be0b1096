"""What a client can make the broker hold with input it never completes: a bounded amount for each
message begun, whatever the framing."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from pamqp import body, commands, frame, header
from session_client import Client, Harness

from lavinpy.amqp.spool import SPOOL_MIN_BODY


@pytest.fixture
def client(tmp_path: Path) -> Iterator[Client]:
    h = Harness(tmp_path)
    c = h.connect()
    c.handshake()
    yield c
    h.close()


def test_a_small_body_sent_in_one_byte_frames_is_held_at_about_its_size(client: Client) -> None:
    """On 10 channels a message of SPOOL_MIN_BODY bytes (the largest kept in memory) is begun and all
    but its last byte sent as 1-byte body frames: the broker holds about the bytes received (each frame
    was kept as an object of its own: 8 times as much, 0.5 GiB for one connection on 2,047 channels).
    The last byte then completes each message, intact."""
    channels = 10
    for channel in range(1, channels + 1):
        client.open_channel(channel)
    client.send((1, commands.Queue.Declare(queue="q")))
    client.read()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for channel in range(1, channels + 1):
            client.send((channel, commands.Basic.Publish(routing_key="q")),
                        (channel, header.ContentHeader(0, SPOOL_MIN_BODY, commands.Basic.Properties())),
                        _one_byte(channel) * (SPOOL_MIN_BODY - 1))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < channels * SPOOL_MIN_BODY * 1.6, held
    queue = client.harness.broker.vhosts["/"].queues["q"]
    assert queue.message_count == 0
    client.send(*[_one_byte(channel) for channel in range(1, channels + 1)])
    client.read()
    assert queue.message_count == channels
    client.open_channel(channels + 1)
    client.send((channels + 1, commands.Basic.Get(queue="q", no_ack=True)))
    bodies = [f for _, f in client.read() if type(f).__name__ == "ContentBody"]
    assert [bytes(b.value) for b in bodies] == [b"\x01" * SPOOL_MIN_BODY]


def _one_byte(channel: int) -> bytes:
    """A body frame of one byte on ``channel`` (the byte is the channel's number)."""
    return frame.marshal(body.ContentBody(bytes((channel,))), channel)


def test_before_tune_ok_frames_are_bounded_by_initial_frame_max(tmp_path: Path) -> None:
    """A client that has not logged in may send frames up to initial_frame_max (8192, RabbitMQ 4.1's):
    a stranger's connection announcing a frame of frame_max (128 KiB) is closed on its first 7 bytes
    instead of having the broker buffer the rest (500 such connections held 62 MiB), while a start-ok
    carrying credentials of several KiB (a JWT) logs in, and after tune-ok frames up to the
    negotiated frame_max are read."""
    from lavinpy.amqp.connection import CLOSED, OPEN
    from lavinpy.amqp.effects import Effect

    h = Harness(tmp_path)
    try:
        stranger = h.connect()
        stranger.send(b"AMQP\x00\x00\x09\x01" + b"\x01\x00\x00" + (131064).to_bytes(4, "big") + b"\x00" * 1000)
        stranger.read()
        assert stranger.conn.state == CLOSED and Effect.CLOSE in stranger.effects
        assert stranger.conn.reader.buffered == 0

        client = h.connect(("127.0.0.1", 50001))
        client.handshake(password="guest", capabilities={"padding": "x" * 6000})  # a start-ok of 6 KiB
        assert client.conn.state == OPEN and client.conn.reader.frame_max == 131072
        client.open_channel(1)
        client.send((1, commands.Queue.Declare(queue="q")), *client.publish(1, "q", b"b" * 100_000))
        client.read()
        assert h.broker.vhosts["/"].queues["q"].message_count == 1
    finally:
        h.close()
