"""The output hold's room check compiled (``_cwire.consumers_have_room``) and its pure twin
(``AMQPConnection.consumers_have_room``) agree on every connection state that decides it: channels with
and without consumers, a channel-wide prefetch (basic.qos global) full or not, consumers' own windows full
or not, unlimited (prefetch 0) and no-ack consumers; and the compiled check computes it itself (the
method is not called) unless the connection's class has a method of its own. Skipped on the pure path."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from pamqp import commands
from session_client import Harness

from lavinpy.amqp import output
from lavinpy.amqp.connection import AMQPConnection
from lavinpy.wire import accel

pytestmark = pytest.mark.skipif(not accel.COMPILED, reason="the pure-Python path is selected")


@pytest.fixture
def conn(tmp_path: Path) -> Any:
    """A connection with three channels: two consumers on channel 1, one on 2, none on 3."""
    harness = Harness(tmp_path)
    client = harness.open_client(declare=commands.Queue.Declare(queue="work"))
    for channel, tags in ((1, ("a", "b")), (2, ("c",)), (3, ())):
        if channel != 1:
            client.open_channel(channel)
        for tag in tags:
            client.send((channel, commands.Basic.Consume(queue="work", consumer_tag=tag)))
            client.read()
    yield client.conn
    harness.close()


def _states(conn: Any) -> Any:
    """Every combination of the deciding values (each consumer: window full, room, unlimited, no-ack;
    channel 1's channel-wide prefetch: none, room, full), set on the connection in turn."""
    one, two = conn.channels[1], conn.channels[2]
    consumers = [*one.consumers.values(), *two.consumers.values()]
    kinds = ("full", "room", "unlimited", "no_ack")
    for shapes in itertools.product(kinds, repeat=len(consumers)):
        for wide in ("none", "room", "full"):
            for consumer, shape in zip(consumers, shapes, strict=True):
                consumer.no_ack = shape == "no_ack"
                consumer.prefetch = 0 if shape == "unlimited" else 10
                consumer.unacked = 10 if shape == "full" else 3
            deliveries = one.deliveries
            deliveries.prefetch = 0 if wide == "none" else 5
            deliveries.unacked._count = 5 if wide == "full" else 2
            yield shapes, wide


def test_the_compiled_check_gives_the_twins_answer_without_calling_it(conn: Any,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    twin = AMQPConnection.consumers_have_room
    calls = []

    def counted(self: Any) -> bool:
        calls.append(self)
        return twin(self)

    # The compiled check computes the answer for the registered method only: registered, it is not called.
    monkeypatch.setattr(AMQPConnection, "consumers_have_room", counted)
    output.init_room_check(counted)
    try:
        answers = {True: 0, False: 0}
        for shapes, wide in _states(conn):
            compiled = output._have_room(conn)
            assert compiled is twin(conn), (shapes, wide)
            answers[compiled] += 1
        assert not calls
        assert answers[True] > 50 and answers[False] > 10  # both answers seen, in many states
    finally:
        output.init_room_check(twin)


def test_a_class_with_its_own_check_is_asked(conn: Any) -> None:
    class Other:
        def consumers_have_room(self) -> str:
            return "asked"

    assert output._have_room(Other()) == "asked"  # type: ignore[arg-type]


def test_a_channel_without_consumers_alone_has_no_room(conn: Any) -> None:
    for channel_id in (1, 2):
        for consumer in conn.channels[channel_id].consumers.values():
            consumer.unacked, consumer.prefetch = 10, 10
    assert output._have_room(conn) is False is AMQPConnection.consumers_have_room(conn)
    conn.channels[2].consumers["c"].unacked = 9
    assert output._have_room(conn) is True is AMQPConnection.consumers_have_room(conn)
