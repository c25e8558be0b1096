"""Nothing after a close-ok: channel.close-ok ends a channel's output, connection.close-ok hands the
socket to the client, which closes it (AMQP 0-9-1 sections 2.2.4 and 2.2.6)."""

from __future__ import annotations

import socket
import time

from pamqp import frame

from . import uid
from .rawamqp import RawAMQP, commands

BYE = commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)


def _frames_until(c: RawAMQP, cls: type, channel: int) -> list[tuple[int, object]]:
    """Every frame up to and including the first cls on channel."""
    seen = []
    while True:
        ch, f = c.recv()
        seen.append((ch, f))
        if isinstance(f, cls) and ch == channel:
            return seen


def _publish_then_close(c: RawAMQP, queue: str, n: int, persistent: bool) -> None:
    """n confirmed publishes and channel.close in one write, as a client closing at once does."""
    props = commands.Basic.Properties(delivery_mode=2 if persistent else 1)
    out = b"".join(frame.marshal(commands.Basic.Publish(exchange="", routing_key=queue), 1)
                   + c.content_frames(1, b"m%d" % i, props) for i in range(n))
    out += frame.marshal(BYE, 1)
    c.send_raw(out)


def test_no_confirm_after_channel_close_ok(broker):
    """Confirms not sent by channel.close-ok are never sent: the client has forgotten the channel."""
    for persistent in (False, True):
        q = uid("close-order")
        with RawAMQP(broker.host, broker.port) as c:
            c.handshake()
            c.open_channel(1)
            c.call(1, commands.Queue.Declare(queue=q, durable=persistent, auto_delete=not persistent),
                   commands.Queue.DeclareOk)
            c.call(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
            for _ in range(5):
                _publish_then_close(c, q, 20, persistent)
                _frames_until(c, commands.Channel.CloseOk, 1)
                # A round trip on another channel: whatever the broker sends for channel 1 comes before it.
                c.send(2, commands.Channel.Open())
                after = _frames_until(c, commands.Channel.OpenOk, 2)
                late = [(ch, f) for ch, f in after if ch == 1]
                assert not late, f"frames on channel 1 after its close-ok: {late!r}"
                time.sleep(0.05)  # an fsync-delayed confirm would be sent by now
                c.send(2, BYE)
                late = [(ch, f) for ch, f in _frames_until(c, commands.Channel.CloseOk, 2) if ch == 1]
                assert not late, f"frames on channel 1 after its close-ok: {late!r}"
                c.open_channel(1)
                c.call(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
                # The reopened channel's confirms start at 1 and are the only ones it gets.
                c.publish(1, "", q, b"x", commands.Basic.Properties(delivery_mode=2 if persistent else 1))
                ack = c.expect(commands.Basic.Ack, 1)
                assert (ack.delivery_tag, ack.multiple) == (1, False)
                c.call(1, BYE, commands.Channel.CloseOk)
                c.open_channel(1)
                c.call(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
            c.call(1, commands.Queue.Delete(queue=q), commands.Queue.DeleteOk)


def _assert_silent(c: RawAMQP, seconds: float, what: str) -> None:
    """No byte and no close from the broker for that long."""
    c.sock.settimeout(seconds)
    try:
        data = c.sock.recv(65536)
    except TimeoutError:
        return
    raise AssertionError(f"{what}: the broker sent {data!r}" if data else f"{what}: the broker closed the socket")


def _stream_publishes(c: RawAMQP, seconds: float) -> int:
    """Keep writing publishes for a while; returns how many bytes went out (raises on EPIPE/RST)."""
    chunk = b"".join(frame.marshal(commands.Basic.Publish(exchange="", routing_key="nowhere"), 1)
                     + c.content_frames(1, b"p" * 200) for _ in range(200))
    sent = 0
    end = time.monotonic() + seconds
    c.sock.settimeout(5)
    while time.monotonic() < end:
        c.sock.sendall(chunk)
        sent += len(chunk)
    return sent


def test_close_ok_waits_for_the_client_to_close(broker):
    """After connection.close-ok the broker reads and discards until the client closes the socket."""
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        # Publishes already written behind the close, as a client with a full write buffer has.
        c.send(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
        sent = _stream_publishes(c, 0.5)  # on a reset socket this raises BrokenPipe/ConnectionReset
        assert sent
        c.expect(commands.Connection.CloseOk, 0)
        assert not c.buf, f"frames after close-ok: {c.buf!r}"
        _assert_silent(c, 0.5, "after close-ok")
        _stream_publishes(c, 0.2)  # still read and discarded, no reply
        _assert_silent(c, 0.3, "after close-ok")
        c.sock.shutdown(socket.SHUT_WR)
        assert c.wait_closed(5), "the broker kept the socket after the client closed it"

