"""Connection and channel life cycle: protocol header, start/tune/open, auth, heartbeats, close, limits."""

from __future__ import annotations

import time

import pika
import pytest

from . import get_all, uid
from .rawamqp import (
    CLIENT_PROPERTIES,
    PROTOCOL_HEADER,
    PeerClosed,
    RawAMQP,
    commands,
)

# What the server offers in connection.tune: RabbitMQ's default channel_max, 2047 (channel 0 is
# not counted), as lavinpy does.
EXPECTED_CHANNEL_MAX = 2047


@pytest.mark.parametrize("header", [
    b"AMQP\x01\x01\x00\x0a",      # AMQP 0-10
    b"AMQP\x00\x00\x09\x00",      # 0-9 without the revision
    b"AMQP\x00\x00\x08\x00",      # 0-8
    b"GET / HTTP/1.1\r\n\r\n",    # not AMQP at all
])
def test_wrong_protocol_header_gets_091_header_and_close(broker, header):
    with RawAMQP(broker.host, broker.port) as c:
        c.send_raw(header)
        assert c.recv_bytes(8, timeout=5) == PROTOCOL_HEADER
        assert c.wait_closed(5), "server must close the socket after sending its protocol header"


def test_connection_start_properties(broker):
    with RawAMQP(broker.host, broker.port) as c:
        c.send_raw(PROTOCOL_HEADER)
        start = c.expect(commands.Connection.Start, channel=0)
        assert (start.version_major, start.version_minor) == (0, 9)
        assert set(start.mechanisms.split()) >= {"PLAIN", "AMQPLAIN"}
        assert "en_US" in start.locales.split()
        props = start.server_properties
        assert isinstance(props["product"], str) and props["product"]
        assert isinstance(props["version"], str) and props["version"]
        caps = props["capabilities"]
        for cap in ("publisher_confirms", "exchange_exchange_bindings", "basic.nack",
                    "consumer_cancel_notify", "connection.blocked", "authentication_failure_close",
                    "per_consumer_qos", "direct_reply_to", "consumer_priorities"):
            assert caps.get(cap) is True, f"capability {cap} not advertised"


def test_tune_offers_defaults(broker):
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake()
        assert c.tune.channel_max == EXPECTED_CHANNEL_MAX
        assert c.tune.frame_max == 131072
        assert c.tune.heartbeat == 60
        c.open_channel(1)
        c.send(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
        c.expect(commands.Connection.CloseOk, channel=0)


def test_client_lowered_frame_max_is_honoured(broker):
    """A client that negotiates frame_max 4096 gets no frame bigger than that."""
    q = uid("q")
    body = bytes(range(256)) * 80  # 20480 bytes: several body frames at 4096
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake(frame_max=4096)
        c.open_channel(1)
        c.call(1, commands.Queue.Declare(queue=q, exclusive=True), commands.Queue.DeclareOk)
        c.publish(1, "", q, body)  # content_frames() splits at the negotiated frame_max
        got = c.get_message(1, q)
        assert got is not None
        _, hdr, data = got
        assert hdr.body_size == len(body) and data == body
        assert all(size <= 4096 for _, _, size in c.frames_seen), [s for _, _, s in c.frames_seen]
        body_frames = [s for _, v, s in c.frames_seen if type(v).__name__ == "ContentBody"]
        assert len(body_frames) == 6  # 20480 / (4096 - 8) rounded up


def test_plain_auth_with_pika(clients):
    conn = clients.connect()
    ch = conn.channel()
    assert ch.is_open
    conn.close()
    assert conn.is_closed


def test_amqplain_auth(broker):
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake(mechanism="AMQPLAIN")
        c.open_channel(1)
        c.call(1, commands.Queue.Declare(queue=uid("q"), exclusive=True), commands.Queue.DeclareOk)


@pytest.mark.parametrize("mechanism", ["PLAIN", "AMQPLAIN"])
def test_authentication_failure_is_403(broker, mechanism):
    from .rawamqp import amqplain_response
    with RawAMQP(broker.host, broker.port) as c:
        c.send_raw(PROTOCOL_HEADER)
        c.expect(commands.Connection.Start, channel=0)
        response = amqplain_response("guest", "wrong") if mechanism == "AMQPLAIN" else "\0guest\0wrong"
        c.send(0, commands.Connection.StartOk(client_properties=CLIENT_PROPERTIES, mechanism=mechanism,
                                              response=response))
        close = c.expect_connection_close()
        assert close.reply_code == 403
        assert close.reply_text.startswith("ACCESS_REFUSED")
        assert mechanism in close.reply_text


def test_authentication_failure_with_pika(broker):
    params = pika.URLParameters(broker.url.replace("guest:guest", "guest:wrong"))
    params.connection_attempts = 1
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as e:
        pika.BlockingConnection(params)
    assert "ACCESS_REFUSED" in str(e.value)


def test_unknown_mechanism_refused(broker):
    with RawAMQP(broker.host, broker.port) as c:
        c.send_raw(PROTOCOL_HEADER)
        c.expect(commands.Connection.Start, channel=0)
        c.send(0, commands.Connection.StartOk(client_properties=CLIENT_PROPERTIES, mechanism="CRAM-MD5",
                                              response="x"))
        try:
            _, reply = c.recv(timeout=10)
        except PeerClosed:
            return  # RabbitMQ just closes the socket
        assert isinstance(reply, commands.Connection.Close), f"handshake went on: {reply!r}"
        assert reply.reply_code in (403, 503, 530, 540)


def test_unknown_vhost_is_530(broker):
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake(open_vhost=False)
        c.send(0, commands.Connection.Open(virtual_host=uid("no-such-vhost")))
        close = c.expect_connection_close()
        assert close.reply_code == 530
        assert close.reply_text.startswith("NOT_ALLOWED")


def test_connection_close_handshake(broker):
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        c.open_channel(2)
        c.send(0, commands.Connection.Close(reply_code=200, reply_text="Normal shutdown", class_id=0,
                                                   method_id=0))
        c.expect(commands.Connection.CloseOk, channel=0)


@pytest.mark.parametrize("hb", [1])
def test_silent_client_is_dropped_after_missed_heartbeats(broker, hb):
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake(heartbeat_s=hb)
        t0 = time.monotonic()
        with pytest.raises(PeerClosed):
            while True:
                c.recv(timeout=4 * hb + 3)
        elapsed = time.monotonic() - t0
        assert c.heartbeats_seen >= 1, "server sent no heartbeat frame"
        # RabbitMQ drops the client after two missed checks: about 2-3 intervals of silence.
        assert 1.5 * hb <= elapsed <= 4 * hb + 1, elapsed


def test_client_sending_heartbeats_stays_connected(broker):
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake(heartbeat_s=1)
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            c.send_heartbeat()
            try:
                c.recv(timeout=0.4)
            except TimeoutError:
                pass
        c.open_channel(1)  # still alive after 4 intervals


def test_heartbeat_zero_disables(broker):
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake(heartbeat_s=0)
        with pytest.raises(TimeoutError):
            c.recv(timeout=2.5)
        assert c.heartbeats_seen == 0
        c.open_channel(1)


def test_publish_immediate_is_540(broker):
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        c.publish(1, "", uid("q"), b"x", immediate=True)
        close = c.expect_connection_close()
        assert close.reply_code == 540
        assert close.reply_text.startswith("NOT_IMPLEMENTED")
        assert "immediate" in close.reply_text
        assert (close.class_id, close.method_id) == (60, 40)


def test_recover_without_requeue_is_540(broker):
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        c.send(1, commands.Basic.Recover(requeue=False))
        close = c.expect_connection_close()
        assert close.reply_code == 540
        assert (close.class_id, close.method_id) == (60, 110)


def test_channel_open_close_reopen(clients):
    conn = clients.connect()
    chans = [conn.channel() for _ in range(5)]
    numbers = {ch.channel_number for ch in chans}
    assert len(numbers) == 5
    for ch in chans:
        ch.close()
    ch = conn.channel()
    q = ch.queue_declare(uid("q"), exclusive=True).method.queue
    ch.basic_publish("", q, b"m")
    assert [m[2] for m in get_all(ch, q)] == [b"m"]


def test_channel_flow(broker):
    """channel.flow active=true is confirmed; RabbitMQ refuses active=false with 540."""
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        ok = c.call(1, commands.Channel.Flow(active=True), commands.Channel.FlowOk)
        assert ok.active is True
        c.send(1, commands.Channel.Flow(active=False))
        close = c.expect_connection_close()
        assert close.reply_code == 540
        assert (close.class_id, close.method_id) == (20, 20)


def test_reopening_an_open_channel_is_504(broker):
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        c.send(1, commands.Channel.Open())
        close = c.expect_connection_close()
        assert close.reply_code == 504


def test_more_channels_than_channel_max_is_530(broker):
    """RabbitMQ counts open channels against the negotiated channel_max: the one too many gets 530."""
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake(channel_max=4)
        for n in range(1, 5):
            c.open_channel(n)
        c.send(5, commands.Channel.Open())
        close = c.expect_connection_close()
        assert close.reply_code == 530
        assert close.reply_text.startswith("NOT_ALLOWED")


def test_channel_close_handshake_keeps_connection(broker):
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        c.send(1, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
        c.expect(commands.Channel.CloseOk, channel=1)
        c.open_channel(1)  # the number can be reused
        c.call(1, commands.Queue.Declare(queue=uid("q"), exclusive=True), commands.Queue.DeclareOk)


def test_many_connections_and_channels(clients):
    conns = [clients.connect() for _ in range(10)]
    chans = [conn.channel() for conn in conns for _ in range(5)]
    q = chans[0].queue_declare(uid("q"), exclusive=True).method.queue
    for ch in chans[:1]:
        for i in range(50):
            ch.basic_publish("", q, str(i).encode())
    assert len(get_all(chans[0], q)) == 50
