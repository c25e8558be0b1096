"""Malformed and illegal input over raw sockets.

Each case checks the exact reply the server sends (connection- or channel-level, and the code RabbitMQ
uses), and that a second, independent connection keeps working during and after, with the messages it
stored before still there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from pamqp import frame as pframe
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from . import bodies, get_all, persistent, uid
from .conftest import ON_LAVINPY
from .rawamqp import PeerClosed, RawAMQP, commands, method_payload, raw_frame


class Witness:
    """A well-behaved client on its own connection, with messages stored before the bad input."""

    def __init__(self, clients) -> None:
        self.conn, self.ch = clients.channel()
        self.ch.confirm_delivery()
        self.q = clients.track_queue(uid("witness"))
        self.ch.queue_declare(self.q, durable=True)
        self.expected = [f"before-{i}".encode() for i in range(3)]
        for body in self.expected:
            self.ch.basic_publish("", self.q, body, persistent())

    def round_trip(self, tag: str) -> None:
        tmp = self.ch.queue_declare("", exclusive=True).method.queue
        self.ch.basic_publish("", tmp, tag.encode())
        assert bodies(get_all(self.ch, tmp)) == [tag.encode()]
        self.ch.queue_delete(tmp)
        self.ch.basic_publish("", self.q, tag.encode(), persistent())
        self.expected.append(tag.encode())

    def check(self) -> None:
        self.round_trip("after")
        assert bodies(get_all(self.ch, self.q)) == self.expected


def _pub(c: RawAMQP, queue: str = "nowhere", ch: int = 1) -> None:
    c.send(ch, commands.Basic.Publish(exchange="", routing_key=queue))


def _hdr(size: int, ch: int = 1) -> bytes:
    return pframe.marshal(ContentHeader(0, size, commands.Basic.Properties()), ch)


def _body(data: bytes, ch: int = 1) -> bytes:
    return pframe.marshal(ContentBody(data), ch)


@dataclass
class Case:
    send: Callable[[RawAMQP], None]
    level: str  # "connection" or "channel"
    codes: tuple[int, ...]
    frame_max: int | None = None
    rabbitmq_drops_socket: bool = False  # RabbitMQ closes the TCP connection without connection.close


CASES: dict[str, Case] = {
    # a method frame bigger than the negotiated frame_max
    "method_frame_over_frame_max": Case(
        lambda c: c.send_raw(raw_frame(1, 1, method_payload(60, 40, b"\0\0" + b"x" * 200000))),
        "connection", (501,)),
    # a body frame bigger than frame_max, in the middle of a proper publish
    "body_frame_over_frame_max": Case(
        lambda c: (_pub(c), c.send_raw(_hdr(200000) + raw_frame(3, 1, b"x" * 200000))),
        "connection", (501,)),
    # the client lowered frame_max to 4096: a 5000-byte frame is too big
    "frame_over_lowered_frame_max": Case(
        lambda c: (_pub(c), c.send_raw(_hdr(5000) + raw_frame(3, 1, b"x" * 5000))),
        "connection", (501,), frame_max=4096),
    "bad_frame_end_byte": Case(
        lambda c: c.send_raw(raw_frame(1, 1, method_payload(60, 10, b"\0\0\0\0\0\0\0"), end=b"\x00")),
        "connection", (501,)),
    "unknown_frame_type": Case(lambda c: c.send_raw(raw_frame(9, 1, b"abc")), "connection", (501,)),
    "method_on_unopened_channel": Case(
        lambda c: c.send(7, commands.Queue.Declare(queue="", exclusive=True)), "connection", (504,)),
    "channel_method_on_channel_zero": Case(
        lambda c: c.send(0, commands.Queue.Declare(queue="", exclusive=True)), "connection", (504,)),
    "body_without_header": Case(
        lambda c: (_pub(c), c.send_raw(_body(b"abc"))), "connection", (505,)),
    "header_without_publish": Case(lambda c: c.send_raw(_hdr(3)), "connection", (505,)),
    "body_without_publish": Case(lambda c: c.send_raw(_body(b"abc")), "connection", (505,)),
    "method_before_body": Case(
        lambda c: (_pub(c), c.send_raw(_hdr(3)), c.send(1, commands.Basic.Qos(prefetch_count=1))),
        "connection", (505,)),
    "method_before_header": Case(
        lambda c: (_pub(c), c.send(1, commands.Basic.Qos(prefetch_count=1))), "connection", (505,)),
    "content_header_on_channel_zero": Case(lambda c: c.send_raw(_hdr(3, ch=0)), "connection", (505,)),
    # RabbitMQ keeps waiting for the rest of the body and fails on the next frame with 505;
    # detecting the overrun at once with 501 is fine too
    "body_longer_than_announced": Case(
        lambda c: (_pub(c), c.send_raw(_hdr(3) + _body(b"abcdef")),
                   c.send(1, commands.Basic.Qos(prefetch_count=1))),
        "connection", (501, 505)),
    "body_after_empty_message": Case(
        lambda c: (_pub(c), c.send_raw(_hdr(0) + _body(b"abc"))), "connection", (505,)),
    # the spec wants 501 for a heartbeat on a channel other than 0; RabbitMQ answers 505
    "heartbeat_on_channel": Case(lambda c: c.send_raw(raw_frame(8, 1, b"")), "connection", (501, 505)),
    # RabbitMQ answers 501 for undecodable arguments; 502 (syntax error) is the other legal reading
    "truncated_method_arguments": Case(
        lambda c: c.send_raw(raw_frame(1, 1, method_payload(50, 10, b"\x00\x00\x05ab"))),
        "connection", (501, 502)),
    "malformed_utf8_queue_name": Case(
        lambda c: c.send_raw(raw_frame(1, 1, method_payload(50, 10, b"\x00\x00\x02\xff\xfe" + b"\0" * 5))),
        "connection", (501, 502)),
    # RabbitMQ's reader crashes on these and drops the socket; lavinpy must say 540 NOT_IMPLEMENTED
    "unknown_method": Case(lambda c: c.send_raw(raw_frame(1, 1, method_payload(60, 99))),
                           "connection", (540,), rabbitmq_drops_socket=True),
    "unknown_class": Case(lambda c: c.send_raw(raw_frame(1, 1, method_payload(99, 10))),
                          "connection", (540,), rabbitmq_drops_socket=True),
    "second_channel_open": Case(lambda c: c.send(1, commands.Channel.Open()), "connection", (504,)),
    "tune_ok_after_open": Case(
        lambda c: c.send(0, commands.Connection.TuneOk(channel_max=10, frame_max=131072, heartbeat=0)),
        "connection", (503, 504)),
    "publish_immediate": Case(
        lambda c: c.publish(1, "", "nowhere", b"x", immediate=True), "connection", (540,)),
    # channel-level errors: the connection survives
    "reserved_exchange_name": Case(
        lambda c: c.send(1, commands.Exchange.Declare(exchange="amq." + uid("x"), exchange_type="direct")),
        "channel", (403,)),
    "unknown_exchange_publish": Case(
        lambda c: c.publish(1, uid("missing"), "k", b"x"), "channel", (404,)),
    "unknown_exchange_passive": Case(
        lambda c: c.send(1, commands.Exchange.Declare(exchange=uid("missing"), passive=True)),
        "channel", (404,)),
    "unknown_queue_passive": Case(
        lambda c: c.send(1, commands.Queue.Declare(queue=uid("missing"), passive=True)), "channel", (404,)),
    "unknown_queue_get": Case(lambda c: c.send(1, commands.Basic.Get(queue=uid("missing"))), "channel", (404,)),
    "unknown_queue_bind": Case(
        lambda c: c.send(1, commands.Queue.Bind(queue=uid("missing"), exchange="amq.direct")),
        "channel", (404,)),
    "redeclare_exchange_other_type": Case(
        lambda c: (c.call(1, commands.Exchange.Declare(exchange="e-" + c.name, exchange_type="direct",
                                                       auto_delete=True), commands.Exchange.DeclareOk),
                   c.send(1, commands.Exchange.Declare(exchange="e-" + c.name, exchange_type="topic",
                                                       auto_delete=True))),
        "channel", (406,)),
    "redeclare_queue_other_arguments": Case(
        lambda c: (c.call(1, commands.Queue.Declare(queue=c.name, exclusive=True,
                                                    arguments={"x-max-length": 5}), commands.Queue.DeclareOk),
                   c.send(1, commands.Queue.Declare(queue=c.name, exclusive=True,
                                                    arguments={"x-max-length": 6}))),
        "channel", (406,)),
    "redeclare_queue_other_durable": Case(
        lambda c: (c.call(1, commands.Queue.Declare(queue=c.name, auto_delete=True), commands.Queue.DeclareOk),
                   c.send(1, commands.Queue.Declare(queue=c.name, auto_delete=True, durable=True))),
        "channel", (406,)),
    "ack_unknown_delivery_tag": Case(
        lambda c: (c.send(1, commands.Basic.Ack(delivery_tag=42)), c.send(1, commands.Basic.Qos())),
        "channel", (406,)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input(broker, clients, name):
    case = CASES[name]
    witness = Witness(clients)
    with RawAMQP(broker.host, broker.port) as c:
        c.name = uid("bad")
        c.handshake(frame_max=case.frame_max)
        c.open_channel(1)
        case.send(c)
        witness.round_trip("during")
        if case.level == "connection":
            try:
                close = c.expect_connection_close()
            except PeerClosed:
                if case.rabbitmq_drops_socket and not ON_LAVINPY:
                    witness.check()
                    return
                raise
            assert close.reply_code in case.codes, (close.reply_code, close.reply_text)
        else:
            close = c.expect_channel_close(1)
            assert close.reply_code in case.codes, (close.reply_code, close.reply_text)
            # the connection and its other channels go on
            c.open_channel(2)
            c.call(2, commands.Queue.Declare(queue="", exclusive=True), commands.Queue.DeclareOk)
            c.open_channel(1)
        assert close.reply_text, "reply text must say what was wrong"
    witness.check()


def test_wrong_delivery_tag_text(broker, clients):
    witness = Witness(clients)
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        c.send(1, commands.Basic.Ack(delivery_tag=42))
        close = c.expect_channel_close(1)
        assert (close.reply_code, close.reply_text) == (406, "PRECONDITION_FAILED - unknown delivery tag 42")
        assert (close.class_id, close.method_id) == (60, 80)
    witness.check()


def test_exclusive_queue_from_another_connection(broker, clients):
    witness = Witness(clients)
    with RawAMQP(broker.host, broker.port) as owner, RawAMQP(broker.host, broker.port) as other:
        owner.handshake()
        owner.open_channel(1)
        q = uid("excl")
        owner.call(1, commands.Queue.Declare(queue=q, exclusive=True), commands.Queue.DeclareOk)
        other.handshake()
        other.open_channel(1)
        other.send(1, commands.Queue.Declare(queue=q, exclusive=True))
        close = other.expect_channel_close(1)
        assert close.reply_code == 405 and close.reply_text.startswith("RESOURCE_LOCKED")
        assert q in close.reply_text
        other.open_channel(1)
        other.send(1, commands.Basic.Consume(queue=q))
        assert other.expect_channel_close(1).reply_code == 405
        # the owner is unaffected
        owner.call(1, commands.Queue.Declare(queue=q, passive=True), commands.Queue.DeclareOk)
    witness.check()


def test_disconnect_in_the_middle_of_a_message(broker, clients):
    """A publisher that vanishes mid-body publishes nothing; the broker goes on."""
    witness = Witness(clients)
    q = witness.ch.queue_declare(uid("q"), exclusive=True).method.queue
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        c.publish(1, "", q, b"complete")
        _pub(c, q)
        c.send_raw(_hdr(100) + _body(b"x" * 50))
    witness.round_trip("during")
    assert bodies(get_all(witness.ch, q)) == [b"complete"]
    witness.check()


def test_disconnect_mid_frame(broker, clients):
    witness = Witness(clients)
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        c.send_raw(raw_frame(1, 1, method_payload(50, 10, b"\0\0\x05abcde" + b"\0" * 5))[:9])
    with RawAMQP(broker.host, broker.port) as c:
        c.send_raw(b"AMQP\x00\x00")  # half a protocol header, then gone
    witness.check()


def test_garbage_instead_of_handshake(broker, clients):
    witness = Witness(clients)
    with RawAMQP(broker.host, broker.port) as c:
        c.send_raw(bytes(range(256)) * 4)
        assert c.recv_bytes(8, timeout=5) in (b"AMQP\x00\x00\x09\x01", b"")
        assert c.wait_closed(5)
    witness.check()


def test_idle_socket_before_handshake_does_not_block_others(broker, clients):
    """A socket that sends nothing does not hold the server up (it is dropped later, not at once)."""
    witness = Witness(clients)
    with RawAMQP(broker.host, broker.port) as c:
        witness.round_trip("while-idle")
        assert not c.wait_closed(1)  # not dropped at once
    witness.check()
