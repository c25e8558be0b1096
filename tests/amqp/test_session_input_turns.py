"""A connection's input in turns: large multiple acks count toward a turn's work as methods do, and
input held for the next turn is still applied when the socket goes before that turn comes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pamqp import commands
from session_client import Client, Harness

from lavinpy.amqp import connection as connection_module
from lavinpy.amqp.effects import SetTimer, TimerKind

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


def test_acks_held_for_the_next_turn_count_when_the_socket_goes(harness: Harness,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection_module, "SETTLED_PER_METHOD", 1)
    client = consuming_client(harness, 300)
    client.send(*[(1, commands.Basic.Ack(delivery_tag=tag, multiple=True)) for tag in (100, 200, 300)],
                (0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)))
    client.read()
    assert unacked(harness) == 200
    client.conn.lost()  # the client closed its socket without waiting for close-ok
    queue = harness.broker.vhosts["/"].queues["q"]
    assert (queue.message_count, unacked(harness), queue.stats.ack) == (0, 0, 300)  # none requeued


def test_methods_held_for_the_next_turn_are_applied_when_the_socket_goes(harness: Harness) -> None:
    count = connection_module.METHODS_PER_TURN + 50
    client = harness.open_client()
    client.send(*[(1, commands.Queue.Declare(queue=f"q{i}")) for i in range(count)])
    assert len(client.names()) == connection_module.METHODS_PER_TURN  # the rest in the next turn
    client.conn.lost()
    queues = harness.broker.vhosts["/"].queues
    assert all(f"q{i}" in queues for i in range(count))


def test_held_methods_are_dropped_once_the_broker_closed_the_connection(harness: Harness) -> None:
    count = connection_module.METHODS_PER_TURN + 50
    client = harness.open_client()
    client.send(*[(1, commands.Queue.Declare(queue=f"q{i}")) for i in range(count)])
    client.read()
    client.conn.close(320, "CONNECTION_FORCED - closed by an administrator")  # before the next turn
    client.conn.lost()
    queues = harness.broker.vhosts["/"].queues
    assert sum(f"q{i}" in queues for i in range(count)) == connection_module.METHODS_PER_TURN
