"""Replies after the disk on the sans-IO AMQP session (broker.ops.replies): in the order of their methods,
and an answer for each kind when the flush or the replication fails (basic.nack, channel.close 506),
never a hang. A running event loop drives the store's group commit; the disk or the replication
fails under the store for one step (tests/mqtt/test_mqtt_replies.py: the MQTT PUBACK)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
from pamqp import commands
from session_client import Client, Frame, Harness

from tests.broker.durability_faults import FAILURES

WAIT = 5.0  # seconds an answer may take before the test calls it a hang
REASON = "RESOURCE_ERROR - could not write to disk or replicate: "


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path)  # fsync "always": durable changes wait for the group commit
    yield h
    h.close()


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(scenario())


async def frames_until(client: Client, done: Callable[[list[Frame]], bool]) -> list[Frame]:
    """The client's method frames, read as the flushes complete, until ``done`` says they are all."""
    seen: list[Frame] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while not done(seen):
        assert loop.time() < deadline, f"no answer (a hang): {[f.name for _, f in seen]}"
        await asyncio.sleep(0.005)
        seen += client.methods()
    return seen


def names(frames: list[Frame]) -> list[str]:
    return [f.name for _, f in frames]


def has(name: str) -> Callable[[list[Frame]], bool]:
    return lambda frames: name in names(frames)


def opened(harness: Harness) -> Client:
    client = harness.connect()
    client.handshake()
    client.open_channel(1)
    return client


async def call(client: Client, method: Any, reply: str) -> Any:
    client.send((1, method))
    [(_, ok)] = await frames_until(client, has(reply))
    return ok


# --- reply order ------------------------------------------------------------------------------------

def test_delete_ok_goes_before_the_basic_cancel_it_causes(harness: Harness) -> None:
    """A consumer of a durable queue deleted on the same channel: queue.delete-ok (after the group
    commit), then basic.cancel, as RabbitMQ sends them."""
    async def scenario() -> None:
        client = opened(harness)
        await call(client, commands.Queue.Declare(queue="durable-q", durable=True), "Queue.DeclareOk")
        await call(client, commands.Basic.Consume(queue="durable-q", consumer_tag="c1"), "Basic.ConsumeOk")
        client.send((1, commands.Queue.Delete(queue="durable-q")))
        frames = await frames_until(client, lambda seen: len(seen) >= 2)
        assert names(frames) == ["Queue.DeleteOk", "Basic.Cancel"]
        assert frames[1][1].consumer_tag == "c1"
    run(scenario)


def test_replies_and_deliveries_follow_a_waiting_declare_ok(harness: Harness) -> None:
    """declare (durable), publish, consume and qos in one read: declare-ok first, then the other
    replies in their methods' order, then the delivery to the new consumer."""
    async def scenario() -> None:
        client = opened(harness)
        client.send((1, commands.Queue.Declare(queue="work", durable=True)), *client.publish(1, "work", b"m"),
                    (1, commands.Basic.Consume(queue="work", consumer_tag="c1")), (1, commands.Basic.Qos()))
        frames = await frames_until(client, has("Basic.Deliver"))
        assert names(frames) == ["Queue.DeclareOk", "Basic.ConsumeOk", "Basic.QosOk", "Basic.Deliver"]
    run(scenario)


def test_a_channel_error_behind_a_waiting_reply_closes_after_it(harness: Harness) -> None:
    async def scenario() -> None:
        client = opened(harness)
        client.send((1, commands.Queue.Declare(queue="d", durable=True)),
                    (1, commands.Queue.Declare(queue="d", durable=False)))  # inequivalent: 406
        frames = await frames_until(client, has("Channel.Close"))
        assert names(frames) == ["Queue.DeclareOk", "Channel.Close"]
        assert frames[1][1].reply_code == 406
    run(scenario)


def test_channel_close_from_the_client_is_answered_at_once(harness: Harness) -> None:
    """A client that closes a channel reads only close-ok: replies still waiting are dropped, the
    close-ok is not held behind them."""
    async def scenario() -> None:
        client = opened(harness)
        client.send((1, commands.Queue.Declare(queue="d", durable=True)),
                    (1, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)))
        assert client.names() == [(1, "Channel.CloseOk")]
        await asyncio.sleep(0.1)  # the flush ends: nothing more on the closed channel
        assert client.names() == []
        client.open_channel(1)
    run(scenario)


# --- a failed flush or replication: one answer per kind -----------------------------------------------

@pytest.mark.parametrize("failure", FAILURES)
def test_a_failed_wait_nacks_the_confirms_and_the_channel_goes_on(harness: Harness, failure: str) -> None:
    async def scenario() -> None:
        client = opened(harness)
        await call(client, commands.Queue.Declare(queue="q", durable=True), "Queue.DeclareOk")
        await call(client, commands.Confirm.Select(), "Confirm.SelectOk")
        persistent = commands.Basic.Properties(delivery_mode=2)
        heal = FAILURES[failure](harness.broker)
        client.send(*client.publish(1, "q", b"a", properties=persistent),
                    *client.publish(1, "q", b"b", properties=persistent))
        [(_, nack)] = await frames_until(client, has("Basic.Nack"))
        assert (nack.delivery_tag, nack.multiple) == (2, True)
        heal()
        client.send(*client.publish(1, "q", b"c", properties=persistent))
        [(_, ack)] = await frames_until(client, has("Basic.Ack"))
        assert (ack.delivery_tag, ack.multiple) == (3, False)
    run(scenario)


@pytest.mark.parametrize("failure", FAILURES)
def test_a_failed_wait_closes_the_channel_of_tx_commit(harness: Harness, failure: str) -> None:
    async def scenario() -> None:
        client = opened(harness)
        await call(client, commands.Queue.Declare(queue="q", durable=True), "Queue.DeclareOk")
        await call(client, commands.Tx.Select(), "Tx.SelectOk")
        client.send(*client.publish(1, "q", b"a", properties=commands.Basic.Properties(delivery_mode=2)))
        heal = FAILURES[failure](harness.broker)
        close = await call(client, commands.Tx.Commit(), "Channel.Close")
        heal()
        assert (close.reply_code, close.class_id, close.method_id) == (506, 90, 20)
        assert close.reply_text.startswith(REASON), close.reply_text
        client.send((1, commands.Channel.CloseOk()))
        client.open_channel(1)  # the client reopens and retries
    run(scenario)


# (method, what must exist before it, whether it writes the definitions log): each -ok reply
METHODS: dict[str, tuple[Any, list[Any], bool]] = {
    "exchange.declare": (commands.Exchange.Declare(exchange="x", exchange_type="direct", durable=True), [], True),
    "exchange.delete": (commands.Exchange.Delete(exchange="x"),
                        [commands.Exchange.Declare(exchange="x", exchange_type="direct", durable=True)], True),
    "exchange.bind": (commands.Exchange.Bind(destination="x", source="amq.direct", routing_key="k"),
                      [commands.Exchange.Declare(exchange="x", exchange_type="direct", durable=True)], True),
    "exchange.unbind": (commands.Exchange.Unbind(destination="x", source="amq.direct", routing_key="k"),
                        [commands.Exchange.Declare(exchange="x", exchange_type="direct", durable=True),
                         commands.Exchange.Bind(destination="x", source="amq.direct", routing_key="k")], True),
    "queue.declare": (commands.Queue.Declare(queue="q", durable=True), [], True),
    "queue.bind": (commands.Queue.Bind(queue="q", exchange="amq.direct", routing_key="k"),
                   [commands.Queue.Declare(queue="q", durable=True)], True),
    "queue.unbind": (commands.Queue.Unbind(queue="q", exchange="amq.direct", routing_key="k"),
                     [commands.Queue.Declare(queue="q", durable=True),
                      commands.Queue.Bind(queue="q", exchange="amq.direct", routing_key="k")], True),
    "queue.purge": (commands.Queue.Purge(queue="q"), [commands.Queue.Declare(queue="q", durable=True)], False),
    "queue.delete": (commands.Queue.Delete(queue="q"), [commands.Queue.Declare(queue="q", durable=True)], True),
}
CASES = [(name, failure) for name, (_, _, writes) in METHODS.items() for failure in FAILURES
         if writes or failure == "replication"]  # a purge writes no definitions: only replication waits


@pytest.mark.parametrize(("name", "failure"), CASES)
def test_a_failed_wait_closes_the_channel_of_a_declaration(harness: Harness, name: str, failure: str) -> None:
    method, before, _ = METHODS[name]

    async def scenario() -> None:
        client = opened(harness)
        for setup in before:
            await call(client, setup, setup.name + "Ok")
        heal = FAILURES[failure](harness.broker)
        close = await call(client, method, "Channel.Close")
        heal()
        index = method.index
        assert (close.reply_code, close.class_id, close.method_id) == (506, index >> 16, index & 0xFFFF)
        assert close.reply_text.startswith(REASON), close.reply_text
        client.send((1, commands.Channel.CloseOk()))
        client.open_channel(1)
        await call(client, commands.Queue.Declare(queue="after", durable=True), "Queue.DeclareOk")
    run(scenario)
