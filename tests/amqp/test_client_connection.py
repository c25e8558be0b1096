"""The sans-IO AMQP client (lavinpy.wire.client_connection) against the broker's sans-IO AMQP
connection, byte to byte in process: no socket, no event loop."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pamqp import commands, frame
from session_client import Harness

from lavinpy.amqp.connection import AMQPConnection
from lavinpy.wire.client_connection import ClientConnection, ClientProtocolError
from lavinpy.wire.client_events import (
    Blocked,
    ChannelClosed,
    ChannelFlow,
    Confirmed,
    ConnectionClosed,
    ConnectionOpened,
    Delivery,
    Event,
    Reply,
    Returned,
    Unblocked,
)
from lavinpy.wire.constants import INTERNAL_MECHANISM, PROTOCOL_HEADER
from lavinpy.wire.writer import HEARTBEAT, method_frame


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path, heartbeat=20)
    yield h
    h.close()


class Pair:
    """A client state machine wired to a server one; ``pump`` moves bytes both ways until both are quiet."""

    def __init__(self, harness: Harness, client: ClientConnection) -> None:
        self.harness = harness
        self.server = AMQPConnection(harness.sessions, ("127.0.0.1", 50000))
        self.server.start()
        self.client = client
        self.events: list[Event] = []
        client.initiate()

    def server_bytes(self) -> bytes:
        self.harness.run_soon()
        self.harness.scheduling.run_tasks()
        self.harness.run_soon()
        return b"".join(self.server.data_to_send())

    def pump(self) -> list[Event]:
        new: list[Event] = []
        for _ in range(50):
            out = self.client.data_to_send()
            if out:
                self.server.receive_data(out)
            back = self.server_bytes()
            if back:
                new += self.client.receive_data(back)
            if not out and not back:
                break
        self.events += new
        return new


def opened(harness: Harness, **options: Any) -> Pair:
    pair = Pair(harness, ClientConnection(**options))
    [event] = pair.pump()
    assert isinstance(event, ConnectionOpened), event
    return pair


def with_channel(harness: Harness, **options: Any) -> tuple[Pair, int]:
    pair = opened(harness, **options)
    channel = pair.client.open_channel()
    assert names(pair.pump()) == [(channel, "Channel.OpenOk")]
    return pair, channel


def names(events: list[Event]) -> list[tuple[int, str]]:
    """Replies as (channel, method name): pamqp's methods do not compare by value."""
    assert all(isinstance(e, Reply) for e in events), events
    return [(e.channel, e.method.name) for e in events]  # type: ignore[union-attr]


@pytest.mark.parametrize("mechanism", ["PLAIN", "AMQPLAIN"])
def test_handshake_with_each_mechanism(harness: Harness, mechanism: str) -> None:
    pair = opened(harness, mechanism=mechanism, name="test link", heartbeat=10, frame_max=65536)
    opened_event = pair.events[0]
    assert isinstance(opened_event, ConnectionOpened)
    assert opened_event.server_properties["product"] == "lavinpy"
    assert (opened_event.heartbeat, opened_event.frame_max) == (10, 65536)  # the lower of both sides
    assert pair.server.client_properties["connection_name"] == "test link"
    assert pair.client.is_open


def test_internal_mechanism_logs_in_with_the_node_token(harness: Harness) -> None:
    token = harness.broker.internal_logins.token("guest")
    pair = opened(harness, mechanism=INTERNAL_MECHANISM, password=token)
    assert pair.client.is_open


def test_wrong_password_ends_with_the_broker_refusal(harness: Harness) -> None:
    pair = Pair(harness, ClientConnection(password="wrong"))
    pair.pump()
    harness.scheduling.fire_timers()  # the login throttle's delay, if any
    pair.pump()
    events = pair.events
    assert [type(e) for e in events] == [ConnectionClosed]
    assert events[0].reply_code == 403 and events[0].by_broker  # type: ignore[union-attr]
    assert pair.client.is_closed and "403" in (pair.client.error or "")


def test_a_mechanism_the_broker_does_not_offer_is_a_clear_error(harness: Harness) -> None:
    pair = Pair(harness, ClientConnection(mechanism="EXTERNAL"))
    with pytest.raises(ClientProtocolError, match="does not offer SASL EXTERNAL"):
        pair.pump()
    assert pair.client.is_closed


def test_external_sends_an_empty_response() -> None:
    client = ClientConnection(mechanism="EXTERNAL")
    client.initiate()
    assert client.data_to_send() == PROTOCOL_HEADER
    start = commands.Connection.Start(server_properties={}, mechanisms="EXTERNAL PLAIN", locales="en_US")
    assert client.receive_data(method_frame(0, start)) == []
    _, _, start_ok = frame.unmarshal(client.data_to_send())
    assert (start_ok.mechanism, start_ok.response) == ("EXTERNAL", "")


def test_heartbeat_from_the_tune(harness: Harness) -> None:
    pair = opened(harness)  # the broker proposes 20 s; the client takes it
    assert pair.client.heartbeat == 20 and pair.client.heartbeat_interval == 10
    assert opened(harness, heartbeat=0).client.heartbeat == 0


def test_rpc_replies_in_order_and_basic_get_with_content(harness: Harness) -> None:
    pair, ch = with_channel(harness)
    client = pair.client
    client.call(ch, commands.Queue.Declare(queue="q1"), commands.Queue.DeclareOk)
    client.call(ch, commands.Queue.Declare(queue="q2"), commands.Queue.DeclareOk)
    replies = pair.pump()
    assert [r.method.queue for r in replies] == ["q1", "q2"]  # type: ignore[union-attr]
    client.publish(ch, "", "q1", b"\x00\x00", b"hello")
    client.call(ch, commands.Basic.Get(queue="q1", no_ack=True), commands.Basic.GetOk, commands.Basic.GetEmpty)
    client.call(ch, commands.Basic.Get(queue="q1", no_ack=True), commands.Basic.GetOk, commands.Basic.GetEmpty)
    got, empty = pair.pump()
    assert isinstance(got, Reply) and isinstance(got.method, commands.Basic.GetOk) and got.body == b"hello"
    assert isinstance(empty, Reply) and isinstance(empty.method, commands.Basic.GetEmpty)


def test_confirms_single_and_multiple(harness: Harness) -> None:
    pair, ch = with_channel(harness)
    client = pair.client
    client.confirm_select(ch)
    client.call(ch, commands.Queue.Declare(queue="q"), commands.Queue.DeclareOk)
    pair.pump()
    tags = [client.publish(ch, "", "q", b"\x00\x00", b"m%d" % i) for i in range(5)]
    assert tags == [1, 2, 3, 4, 5]
    confirms = [e for e in pair.pump() if isinstance(e, Confirmed)]
    assert confirms and confirms[-1].delivery_tag == 5 and not any(c.nack for c in confirms)
    covered = {t for c in confirms for t in (range(1, c.delivery_tag + 1) if c.multiple else [c.delivery_tag])}
    assert covered == {1, 2, 3, 4, 5}
    # basic.nack with multiple, as a broker sends it on a failed flush, is reported as such
    nack = method_frame(ch, commands.Basic.Nack(delivery_tag=7, multiple=True))
    assert client.receive_data(nack) == [Confirmed(ch, 7, True, True)]


def test_deliveries_and_returns_are_assembled(harness: Harness) -> None:
    pair, ch = with_channel(harness, frame_max=4096)
    client = pair.client
    client.call(ch, commands.Queue.Declare(queue="q"), commands.Queue.DeclareOk)
    client.call(ch, commands.Basic.Consume(queue="q", consumer_tag="c1"), commands.Basic.ConsumeOk)
    pair.pump()
    big = bytes(range(256)) * 40  # several body frames
    client.publish(ch, "", "q", b"\x00\x00", big)
    client.publish(ch, "", "nowhere", b"\x00\x00", b"lost", mandatory=True)
    events = pair.pump()
    delivery = next(e for e in events if isinstance(e, Delivery))
    assert (delivery.consumer_tag, delivery.delivery_tag, delivery.routing_key, delivery.body) == ("c1", 1, "q", big)
    returned = next(e for e in events if isinstance(e, Returned))
    assert (returned.reply_code, returned.routing_key, returned.body) == (312, "nowhere", b"lost")
    client.ack(ch, delivery.delivery_tag)
    pair.pump()


def test_channel_flow_blocked_and_unblocked_from_the_broker(harness: Harness) -> None:
    pair, ch = with_channel(harness)
    client = pair.client
    # channel.flow from a broker (lavinpy sends none; RabbitMQ did) is answered with flow-ok
    assert client.receive_data(method_frame(ch, commands.Channel.Flow(active=False))) == [ChannelFlow(ch, False)]
    _, _, flow_ok = frame.unmarshal(client.data_to_send())
    assert isinstance(flow_ok, commands.Channel.FlowOk) and flow_ok.active is False
    harness.sessions.resources_changed("memory alarm")  # what the broker calls on an alarm
    assert pair.pump() == [Blocked("memory alarm")] and client.blocked
    harness.sessions.resources_changed(None)
    assert pair.pump() == [Unblocked()] and not client.blocked


def test_broker_closes_the_channel_and_it_is_answered(harness: Harness) -> None:
    pair, ch = with_channel(harness)
    client = pair.client
    client.call(ch, commands.Queue.Declare(queue="absent", passive=True), commands.Queue.DeclareOk)
    [closed] = pair.pump()
    assert isinstance(closed, ChannelClosed) and closed.reply_code == 404 and closed.channel == ch
    again = client.open_channel(ch)  # the broker got its close-ok: the number is free again
    assert names(pair.pump()) == [(again, "Channel.OpenOk")]


def test_client_closes_a_channel(harness: Harness) -> None:
    pair, ch = with_channel(harness)
    pair.client.close_channel(ch)
    assert names(pair.pump()) == [(ch, "Channel.CloseOk")]
    with pytest.raises(ClientProtocolError, match="not open"):
        pair.client.call(ch, commands.Queue.Declare(queue="q"), commands.Queue.DeclareOk)


def test_client_closes_the_connection(harness: Harness) -> None:
    pair, _ = with_channel(harness)
    pair.client.close(200, "bye")
    assert pair.pump() == [ConnectionClosed(200, "bye", 0, 0, False)]
    assert pair.client.is_closed and pair.client.data_to_send() == b""


def test_broker_closes_the_connection(harness: Harness) -> None:
    pair, ch = with_channel(harness)
    pair.client.send_method(ch, commands.Channel.Open())  # the channel is open already: a connection error
    [closed] = pair.pump()
    assert isinstance(closed, ConnectionClosed) and closed.by_broker and closed.reply_code == 504
    assert pair.client.is_closed and "504" in (pair.client.error or "")
    assert pair.server.data_to_send() == []  # the close-ok went out with the last pump


def test_heartbeats_go_out_when_idle_and_a_silent_broker_is_dead(harness: Harness) -> None:
    pair = opened(harness, heartbeat=10)
    client = pair.client
    assert client.tick() is False and client.data_to_send() == b""  # the handshake went out since
    assert client.tick() is False and client.data_to_send() == HEARTBEAT  # nothing else went out
    client.publish(0, "", "", b"", b"")  # channel 0 is not checked here: only that something was sent
    client.data_to_send()
    assert client.tick() is False and client.data_to_send() == b""  # that write counted as a beat
    client.receive_data(HEARTBEAT)
    client.tick()
    assert [client.tick() for _ in range(3)] == [False, False, False]
    client.note_peer_alive()  # counted at the next tick
    assert [client.tick() for _ in range(4)] == [False, False, False, False]
    assert client.tick() is True  # four half-intervals of silence: two heartbeats
    assert client.is_closed and "missed heartbeats" in (client.error or "")


@pytest.mark.parametrize("bad, match", [
    (b"\x01\x00\x00\x00\x00\x00\x04\x00\x0a\x00\x0a\xff", "frame end"),  # wrong frame-end octet
    (b"\x09\x00\x00\x00\x00\x00\x00\xce", "unknown type"),
    (b"\x02\x00\x05\x00\x00\x00\x0e" + bytes(14) + b"\xce", "not open|out of place"),
    (b"\x01\x00\x00\x00\x00\x00\x04\x00\x63\x00\x01\xce", "cannot decode"),
    (b"AMQP\x00\x00\x08\x00", "refused the AMQP 0-9-1 protocol header"),
])
def test_bad_bytes_from_the_broker_are_a_clear_error(bad: bytes, match: str) -> None:
    client = ClientConnection()
    client.initiate()
    client.data_to_send()
    with pytest.raises(ClientProtocolError, match=match):
        client.receive_data(bad)
    assert client.is_closed
    assert client.receive_data(b"more") == []  # nothing after, and no hang


def test_truncated_hot_methods_are_a_clear_error(harness: Harness) -> None:
    pair, ch = with_channel(harness)
    truncated_ack = b"\x01" + ch.to_bytes(2, "big") + b"\x00\x00\x00\x06\x00\x3c\x00\x50\x00\x01\xce"
    with pytest.raises(ClientProtocolError, match="truncated"):
        pair.client.receive_data(truncated_ack)
    assert pair.client.is_closed


def test_method_out_of_place_during_the_handshake() -> None:
    client = ClientConnection()
    client.initiate()
    with pytest.raises(ClientProtocolError, match="unexpected Connection.OpenOk"):
        client.receive_data(method_frame(0, commands.Connection.OpenOk()))
    _, _, close = frame.unmarshal(client.data_to_send()[8:])
    assert isinstance(close, commands.Connection.Close) and close.reply_code == 505
