"""A connection's input in turns: large multiple acks count toward a turn's work as methods do, and
input held for the next turn is still applied, in turns, when the socket goes before that turn comes
(the driver reports the loss once the input read before it has been applied)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pamqp import commands
from session_client import Client, Harness

from lavinpy.amqp import connection as connection_module
from lavinpy.amqp.effects import SetTimer, TimerKind
from lavinpy.amqp.transport import AMQPProtocol

TURN = SetTimer(TimerKind.INPUT_TURN, 0.0)


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path)
    yield h
    h.close()


def consuming_client(harness: Harness, count: int) -> Client:
    """A client holding ``count`` unacked deliveries (tags 1..count) of queue ``q``."""
    client = harness.open_client(declare=commands.Queue.Declare(queue="q"))
    client.send(*[f for i in range(count) for f in client.publish(1, "q", b"m%d" % i)])
    client.read()
    client.send((1, commands.Basic.Consume(queue="q", consumer_tag="c")))
    delivered = [f for _, f in client.methods() if isinstance(f, commands.Basic.Deliver)]
    assert len(delivered) == count
    client.effects.clear()
    return client


def unacked(harness: Harness) -> int:
    return harness.broker.vhosts["/"].queues["q"].index.unacked_count


def test_multiple_acks_of_many_deliveries_end_the_turn(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    # One settled delivery counts as one method here, so that an ack of 100 fills a turn of 100 methods.
    monkeypatch.setattr(connection_module, "SETTLED_PER_METHOD", 1)
    client = consuming_client(harness, 300)
    client.send(*[(1, commands.Basic.Ack(delivery_tag=tag, multiple=True)) for tag in (100, 200, 300)])
    client.read()
    assert unacked(harness) == 200  # the rest waits for the other clients' turn
    assert TURN in client.effects
    for left in (100, 0):
        client.effects.clear()
        client.conn.timer_fired(TimerKind.INPUT_TURN)
        client.read()
        assert unacked(harness) == left
    queue = harness.broker.vhosts["/"].queues["q"]
    assert (queue.message_count, queue.stats.ack) == (0, 300)


def test_small_multiple_acks_share_a_turn(harness: Harness) -> None:
    client = consuming_client(harness, 300)
    client.send(*[(1, commands.Basic.Ack(delivery_tag=tag, multiple=True)) for tag in (100, 200, 300)])
    client.read()
    assert unacked(harness) == 0
    assert TURN not in client.effects


class TurnLoop:
    """The event loop as the driver uses it once its socket has gone: callbacks for the next turns."""

    def __init__(self) -> None:
        self.soon: list[tuple[Callable[..., None], tuple[Any, ...]]] = []

    def call_soon(self, callback: Callable[..., None], *args: Any) -> None:
        self.soon.append((callback, args))

    def next_turn(self) -> None:
        callback, args = self.soon.pop(0)
        callback(*args)


class GoneTransport:
    def is_closing(self) -> bool:
        return True


def socket_goes(harness: Harness, client: Client) -> TurnLoop:
    """The client's socket is reset under the connection's driver; returns the loop its turns wait on."""
    loop = TurnLoop()

    async def drive() -> None:  # (a driver is made on a running loop)
        driver = AMQPProtocol(harness.sessions)
        driver.conn, driver.transport, driver._loop = client.conn, GoneTransport(), loop  # type: ignore[assignment]
        client.conn.driver = driver
        driver.connection_lost(ConnectionResetError())

    asyncio.run(drive())
    return loop


def test_acks_held_for_the_next_turn_count_when_the_socket_goes(harness: Harness,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection_module, "SETTLED_PER_METHOD", 1)
    client = consuming_client(harness, 300)
    client.send(*[(1, commands.Basic.Ack(delivery_tag=tag, multiple=True)) for tag in (100, 200, 300)],
                (0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)))
    client.read()
    assert unacked(harness) == 200
    loop = socket_goes(harness, client)  # the client closed its socket without waiting for close-ok
    assert unacked(harness) == 100  # the next turn at once, the one after it in the loop's next turn
    assert client.conn in harness.sessions.connections and loop.soon
    while loop.soon:
        loop.next_turn()
    queue = harness.broker.vhosts["/"].queues["q"]
    assert (queue.message_count, unacked(harness), queue.stats.ack) == (0, 0, 300)  # none requeued
    assert client.conn not in harness.sessions.connections  # then lost, once


def test_methods_held_for_the_next_turn_are_applied_in_turns_when_the_socket_goes(harness: Harness) -> None:
    per_turn = connection_module.METHODS_PER_TURN
    count = 3 * per_turn + 50
    client = harness.open_client()
    client.send(*[(1, commands.Queue.Declare(queue=f"q{i}")) for i in range(count)])
    assert len(client.names()) == per_turn  # the rest in the next turns
    queues = harness.broker.vhosts["/"].queues
    loop = socket_goes(harness, client)
    turns = 0
    while loop.soon:
        assert sum(f"q{i}" in queues for i in range(count)) == (2 + turns) * per_turn  # a turn's worth each
        loop.next_turn()
        turns += 1
    assert turns == 2 and all(f"q{i}" in queues for i in range(count))
    assert client.conn not in harness.sessions.connections


def test_a_consumer_gets_nothing_while_its_gone_socket_s_input_is_applied(harness: Harness) -> None:
    client = harness.open_client(declare=commands.Queue.Declare(queue="q"))
    client.send(*[f for i in range(10) for f in client.publish(1, "q", b"m%d" % i)])
    client.read()
    per_turn = connection_module.METHODS_PER_TURN
    client.send(*[(1, commands.Queue.Declare(queue=f"d{i}")) for i in range(per_turn)],
                (1, commands.Basic.Consume(queue="q", consumer_tag="c")),
                *[(1, commands.Queue.Declare(queue=f"e{i}")) for i in range(2 * per_turn)])
    client.read()
    loop = socket_goes(harness, client)  # the consume, then the others' turn
    harness.run_soon()  # the model's deliveries
    queue = harness.broker.vhosts["/"].queues["q"]
    assert queue.consumers and unacked(harness) == 0  # nothing is sent to a socket that is gone
    while loop.soon:
        loop.next_turn()
    assert (queue.message_count, unacked(harness), len(queue.consumers)) == (10, 0, 0)


def test_held_methods_are_dropped_once_the_broker_closed_the_connection(harness: Harness) -> None:
    count = connection_module.METHODS_PER_TURN + 50
    client = harness.open_client()
    client.send(*[(1, commands.Queue.Declare(queue=f"q{i}")) for i in range(count)])
    client.read()
    client.conn.close(320, "CONNECTION_FORCED - closed by an administrator")  # before the next turn
    loop = socket_goes(harness, client)
    assert not loop.soon and client.conn not in harness.sessions.connections
    queues = harness.broker.vhosts["/"].queues
    assert sum(f"q{i}" in queues for i in range(count)) == connection_module.METHODS_PER_TURN
