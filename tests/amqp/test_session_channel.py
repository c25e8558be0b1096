"""Channels driven through AMQPConnection without sockets: open/close, confirms, consume/ack, errors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pamqp import body, commands, header
from session_client import Client, Harness

from lavinpy.amqp import consumer_timeout
from lavinpy.amqp.output import OUTPUT_HOLD_TURNS
from lavinpy.wire.frames import build_method
from lavinpy.wire.writer import method_frame


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path)
    yield h
    h.close()


@pytest.fixture
def client(harness: Harness) -> Client:
    c = harness.connect()
    c.handshake()
    c.open_channel(1)
    return c


def declare(client: Client, channel: int, queue: str) -> None:
    client.send((channel, commands.Queue.Declare(queue=queue)))
    [(_, ok)] = client.methods()
    assert (ok.name, ok.queue) == ("Queue.DeclareOk", queue)


def test_channel_open_close_and_reopen(client: Client) -> None:
    client.send((1, commands.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0)))
    assert client.names() == [(1, "Channel.CloseOk")]
    assert 1 not in client.conn.channels
    client.open_channel(1)
    client.send((1, commands.Channel.Open()))  # already open: a connection error
    [(_, close)] = client.methods()
    assert (close.name, close.reply_code, close.reply_text) == ("Connection.Close", 504,
                                                                 "CHANNEL_ERROR - channel 1 is already open")


def test_publish_with_confirms_acks_a_batch_once(harness: Harness, client: Client) -> None:
    declare(client, 1, "q")
    client.send((1, commands.Confirm.Select()))
    assert client.names() == [(1, "Confirm.SelectOk")]
    client.send(*client.publish(1, "q", b"a"), *client.publish(1, "q", b"b"), *client.publish(1, "q", b"c"))
    [(channel, ack)] = client.methods()
    assert (channel, ack.name, ack.delivery_tag, ack.multiple) == (1, "Basic.Ack", 3, True)
    assert harness.broker.vhosts["/"].queues["q"].message_count == 3

    client.send(*client.publish(1, "q", b"d"))
    [(_, ack)] = client.methods()
    assert (ack.delivery_tag, ack.multiple) == (4, False)


def test_mandatory_publish_without_route_is_returned(client: Client) -> None:
    client.send(*client.publish(1, "nowhere", b"lost", mandatory=True))
    frames = client.read()
    ret = frames[0][1]
    assert (ret.name, ret.reply_code, ret.reply_text, ret.routing_key) == ("Basic.Return", 312, "NO_ROUTE",
                                                                           "nowhere")
    assert isinstance(frames[2][1], body.ContentBody) and frames[2][1].value == b"lost"


def test_consume_deliver_ack(harness: Harness, client: Client) -> None:
    declare(client, 1, "work")
    props = commands.Basic.Properties(content_type="text/plain", message_id="m1")
    client.send(*client.publish(1, "work", b"one", properties=props), *client.publish(1, "work", b"two"))
    assert client.read() == []
    client.send((1, commands.Basic.Consume(queue="work", consumer_tag="c1")))
    frames = client.read()
    assert [(c, type(f).__name__) for c, f in frames] == [
        (1, "ConsumeOk"), (1, "Deliver"), (1, "ContentHeader"), (1, "ContentBody"),
        (1, "Deliver"), (1, "ContentHeader"), (1, "ContentBody")]
    first, head = frames[1][1], frames[2][1]
    assert (first.consumer_tag, first.delivery_tag, first.redelivered, first.routing_key) == ("c1", 1, False,
                                                                                              "work")
    assert isinstance(head, header.ContentHeader)
    assert (head.properties.content_type, head.properties.message_id) == ("text/plain", "m1")
    assert [frames[3][1].value, frames[6][1].value] == [b"one", b"two"]

    queue = harness.broker.vhosts["/"].queues["work"]
    unacked = client.conn.channels[1].deliveries.unacked
    assert (queue.message_count, queue.index.unacked_count, list(unacked)) == (0, 2, [1, 2])
    client.send((1, commands.Basic.Ack(delivery_tag=2, multiple=True)))
    assert client.read() == []
    assert (queue.index.unacked_count, len(client.conn.channels[1].deliveries.unacked)) == (0, 0)


def test_closed_channel_requeues_its_unacked_for_the_next_consumer(harness: Harness, client: Client) -> None:
    declare(client, 1, "work")
    client.send((1, commands.Basic.Qos(prefetch_count=1)))
    client.send((1, commands.Basic.Consume(queue="work", consumer_tag="c1")))
    client.send(*client.publish(1, "work", b"job"))
    assert [type(f).__name__ for _, f in client.read()][-3:] == ["Deliver", "ContentHeader", "ContentBody"]
    other = harness.connect()
    other.handshake()
    other.open_channel(1)
    other.send((1, commands.Basic.Consume(queue="work", consumer_tag="c2")))
    assert other.names() == [(1, "Basic.ConsumeOk")]
    client.send((1, commands.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0)))
    client.read()
    deliver = other.methods()[0][1]
    assert (deliver.name, deliver.consumer_tag, deliver.redelivered) == ("Basic.Deliver", "c2", True)


def test_a_refusal_quoting_a_long_name_is_cut_to_a_short_string(client: Client) -> None:
    """A name may take all of a short string's 255 bytes, so a refusal that quotes one can pass what a
    reply text holds: the text is cut on a character's boundary, and only that channel closes."""
    name = "ж" * 127  # 254 bytes of UTF-8
    client.open_channel(2)
    client.send(method_frame(2, build_method(commands.Queue.Declare, queue=name, passive=True)))
    [(channel, close)] = client.methods()
    assert (channel, close.name, close.reply_code) == (2, "Channel.Close", 404)
    assert close.reply_text.startswith("NOT_FOUND - no queue 'жжж") and len(close.reply_text.encode()) <= 255
    declare(client, 1, "still-open")


def test_channel_error_closes_only_that_channel(harness: Harness, client: Client) -> None:
    client.open_channel(2)
    client.send((2, commands.Queue.Declare(queue="missing", passive=True)))
    [(channel, close)] = client.methods()
    assert (channel, close.name, close.reply_code) == (2, "Channel.Close", 404)
    assert close.reply_text == "NOT_FOUND - no queue 'missing' in vhost '/'"
    assert (close.class_id, close.method_id) == (50, 10)
    # Until close-ok, the closed channel ignores everything else.
    client.send((2, commands.Queue.Declare(queue="ignored")))
    assert client.read() == []
    client.send((2, commands.Channel.CloseOk()))
    assert 2 not in client.conn.channels
    declare(client, 1, "still-works")  # channel 1 and the connection carry on
    assert "ignored" not in harness.broker.vhosts["/"].queues


def test_unknown_delivery_tag_is_406(client: Client) -> None:
    client.send((1, commands.Basic.Ack(delivery_tag=99)))
    [(_, close)] = client.methods()
    assert (close.name, close.reply_code, close.reply_text) == ("Channel.Close", 406,
                                                                "PRECONDITION_FAILED - unknown delivery tag 99")


def test_content_without_publish_is_a_505_connection_error(client: Client) -> None:
    client.send((1, body.ContentBody(b"stray")))
    [(channel, close)] = client.methods()
    assert (channel, close.name, close.reply_code) == (0, "Connection.Close", 505)
    assert close.reply_text == "UNEXPECTED_FRAME - expected a method frame on channel 1, got a content body frame"


def test_direct_reply_to_goes_through_the_session_registry(harness: Harness, client: Client) -> None:
    client.send((1, commands.Basic.Consume(queue="amq.rabbitmq.reply-to", consumer_tag="rpc", no_ack=True)))
    assert client.names() == [(1, "Basic.ConsumeOk")]
    [key] = harness.sessions.reply_to
    assert harness.sessions.reply_to[key] is client.conn.channels[1]
    server = harness.connect()
    server.handshake()
    server.open_channel(1)
    server.send(*server.publish(1, key, b"answer"))
    frames = client.read()
    assert (frames[0][1].name, frames[0][1].routing_key, frames[2][1].value) == ("Basic.Deliver", key, b"answer")
    client.send((1, commands.Basic.Cancel(consumer_tag="rpc")))
    client.read()
    assert harness.sessions.reply_to == {}


def test_consumer_timeout_sweep_closes_the_channel_with_406(harness: Harness, client: Client) -> None:
    declare(client, 1, "slow")
    client.send((1, commands.Basic.Consume(queue="slow", consumer_tag="c")))
    client.send(*client.publish(1, "slow", b"x"))
    client.read()
    connections = harness.sessions.connections
    assert consumer_timeout.sweep(connections, 1000, now=10.0) == 0  # first sight of the oldest delivery
    assert consumer_timeout.sweep(connections, 1000, now=10.5) == 0
    assert consumer_timeout.sweep(connections, 1000, now=11.0) == 1
    [(_, close)] = client.methods()
    assert (close.name, close.reply_code) == ("Channel.Close", 406)
    assert close.reply_text.startswith("PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out. "
                                       "Timeout value used: 1000 ms.")
    assert harness.broker.vhosts["/"].queues["slow"].message_count == 1  # requeued


def test_backed_up_output_holds_deliveries_until_drained(harness: Harness, client: Client) -> None:
    declare(client, 1, "q")
    client.send((1, commands.Basic.Consume(queue="q", consumer_tag="c")))
    client.read()
    client.conn.set_writable(False)
    client.send(*client.publish(1, "q", b"held"))
    assert client.read() == []
    client.conn.set_writable(True)
    assert client.names() == [(1, "Basic.Deliver")]


def test_large_body_over_many_frames_is_written_in_place_and_read_back(tmp_path: Path) -> None:
    harness = Harness(tmp_path, frame_max=8192)
    try:
        client = harness.connect()
        client.handshake()
        client.open_channel(1)
        declare(client, 1, "big")
        payload = bytes(range(256)) * 400  # 100 KiB: 13 body frames, written into its record as they come
        chunks = [payload[i:i + 8184] for i in range(0, len(payload), 8184)]
        publish, head, _ = client.publish(1, "big", payload)
        client.send(publish, head, *[(1, body.ContentBody(c)) for c in chunks[:5]])
        content = client.conn.channels[1].content
        assert content.spooled is None and content.stored is not None and content.stored.written == 5 * 8184
        client.send(*[(1, body.ContentBody(c)) for c in chunks[5:]])
        assert harness.broker.vhosts["/"].queues["big"].message_count == 1

        client.send((1, commands.Basic.Get(queue="big", no_ack=True)))
        frames = client.read()
        assert frames[0][1].name == "Basic.GetOk" and frames[1][1].body_size == len(payload)
        bodies = [f.value for _, f in frames[2:]]
        assert max(len(b) for b in bodies) <= 8192 - 8
        assert b"".join(bodies) == payload
    finally:
        harness.close()


def test_a_run_of_acks_inside_a_content_is_a_505_connection_error(client: Client) -> None:
    # basic.publish, then acks where its content header must come: the run goes the general way,
    # which refuses its first frame as RabbitMQ does.
    client.send((1, commands.Basic.Publish(exchange="", routing_key="q")),
                (1, commands.Basic.Ack(delivery_tag=1)), (1, commands.Basic.Ack(delivery_tag=2)))
    [(channel, close)] = client.methods()
    assert (channel, close.name, close.reply_code) == (0, "Connection.Close", 505)
    assert close.reply_text == ("UNEXPECTED_FRAME - expected content header for class 60 on channel 1, "
                                "got a method frame")


def test_a_run_of_acks_on_channel_0_is_a_connection_error(client: Client) -> None:
    client.send((0, commands.Basic.Ack(delivery_tag=1)), (0, commands.Basic.Ack(delivery_tag=2)))
    [(channel, close)] = client.methods()
    assert (channel, close.name, close.reply_code) == (0, "Connection.Close", 504)
    assert close.reply_text == "CHANNEL_ERROR - unexpected method Basic.Ack on channel 0"


class CountingDriver:
    """A connection's driver that records each write (what the socket's send() would get)."""

    def __init__(self, client: Client) -> None:
        self.conn = client.conn
        self.writes: list[bytes] = []
        client.conn.driver = self

    def pump(self) -> None:
        out = self.conn.data_to_send()
        if out:
            self.writes.append(b"".join(out))

    def deliveries(self) -> list[int]:
        """basic.deliver frames per write."""
        return [data.count(b"\x00\x3c\x00\x3c") for data in self.writes]  # class 60, method 60


def test_consumer_output_is_written_once_per_turn_however_many_inputs_freed_room(harness: Harness,
                                                                              client: Client) -> None:
    """Acks of several clients read in one poll each deliver at once, and each consumer connection's
    deliveries of them leave in one write, in the loop's turn after that input."""
    declare(client, 1, "q")
    consumers = []
    for _ in range(2):
        consumer = harness.connect()
        consumer.handshake()
        consumer.open_channel(1)
        consumer.send((1, commands.Basic.Qos(prefetch_count=1)), (1, commands.Basic.Consume(queue="q")))
        consumer.read()
        consumers.append(consumer)
    first, second = consumers
    client.send(*[frame for i in range(6) for frame in client.publish(1, "q", b"m%d" % i)])
    for consumer in consumers:
        assert consumer.names() == [(1, "Basic.Deliver")]
    drivers = [CountingDriver(consumer) for consumer in consumers]
    queue = harness.broker.vhosts["/"].queues["q"]
    first.send((1, commands.Basic.Ack(delivery_tag=1)))
    second.send((1, commands.Basic.Ack(delivery_tag=1)))
    first.send((1, commands.Basic.Ack(delivery_tag=2)))
    assert queue.message_count == 1  # each ack delivered at once (the round robin: to the one with room)
    assert [d.writes for d in drivers] == [[], []]  # and nothing was written yet
    harness.run_soon()
    assert [d.deliveries() for d in drivers] == [[2], [1]]  # one write per connection


def test_small_consumer_output_waits_a_few_turns_while_input_waits_to_be_read(harness: Harness,
                                                                            client: Client) -> None:
    """While a reader thread holds input the loop has not taken (``input_waiting``), a consuming
    connection's small output waits up to OUTPUT_HOLD_TURNS turns for the deliveries that input brings;
    a connection that does not consume, and any output once no input waits, go out in the next turn."""
    declare(client, 1, "q")
    consumer = harness.connect()
    consumer.handshake()
    consumer.open_channel(1)
    consumer.send((1, commands.Basic.Consume(queue="q", no_ack=True)))
    consumer.read()
    driver, publisher = CountingDriver(consumer), CountingDriver(client)
    harness.sessions.input_waiting = True
    client.send((1, commands.Queue.Declare(queue="other")), *client.publish(1, "q", b"first"))
    turns = 0
    while not driver.writes:
        assert harness.soon, "the output was never written"
        harness.soon.pop(0)()
        turns += 1
        if turns == 1:
            assert len(publisher.writes) == 1  # the declare-ok of a connection that does not consume: at once
        if turns == 2:
            client.send(*client.publish(1, "q", b"second"))  # the input that was waiting: more for the consumer
    assert turns == OUTPUT_HOLD_TURNS + 1 and driver.deliveries() == [2]
    harness.sessions.input_waiting = False
    client.send(*client.publish(1, "q", b"third"))
    harness.soon.pop(0)()
    assert driver.deliveries() == [2, 1]


def test_output_of_a_consumer_whose_window_is_full_is_not_held(harness: Harness, client: Client) -> None:
    """Nothing more can come to a consumer with its prefetch window full: its output goes out in the next
    turn even while input waits to be read."""
    declare(client, 1, "q")
    consumer = harness.connect()
    consumer.handshake()
    consumer.open_channel(1)
    consumer.send((1, commands.Basic.Qos(prefetch_count=2)), (1, commands.Basic.Consume(queue="q")))
    consumer.read()
    driver = CountingDriver(consumer)
    harness.sessions.input_waiting = True
    client.send(*client.publish(1, "q", b"a"))
    harness.soon.pop(0)()
    assert driver.writes == []  # room for one more: held
    client.send(*client.publish(1, "q", b"b"))
    harness.soon.pop(0)()
    assert driver.deliveries() == [2]  # the window is full: written in that turn


def test_output_of_a_channel_whose_shared_window_is_full_is_not_held(harness: Harness, client: Client) -> None:
    """As above with a channel-wide prefetch (basic.qos global): once the channel's window is full, the
    consumer's output goes out in that turn even while input waits to be read."""
    declare(client, 1, "q")
    consumer = harness.connect()
    consumer.handshake()
    consumer.open_channel(1)
    consumer.send((1, commands.Basic.Qos(prefetch_count=2, global_=True)), (1, commands.Basic.Consume(queue="q")))
    consumer.read()
    driver = CountingDriver(consumer)
    harness.sessions.input_waiting = True
    client.send(*client.publish(1, "q", b"a"))
    harness.soon.pop(0)()
    assert driver.writes == []  # room for one more: held
    client.send(*client.publish(1, "q", b"b"))
    harness.soon.pop(0)()
    assert driver.deliveries() == [2]  # the channel's window is full: written in that turn
