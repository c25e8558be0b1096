"""What idle connections cost a broker: one heartbeat timer for all of them (not one each), and a connection
that closes is freed at once by reference counting, not left for a full garbage collection (whose cost
grows with everything left alive, and which message traffic runs every few thousand messages)."""

from __future__ import annotations

import asyncio
import gc

from pamqp import commands

from tests.helpers import wait_until

from .conftest import lavinpy_only
from .rawamqp import RawAMQP
from .test_policies_alarms import InProcessBroker

pytestmark = lavinpy_only("counts the objects of a broker running in-process")

CLIENTS = 40


def _live_timers() -> int:
    return sum(1 for o in gc.get_objects() if isinstance(o, asyncio.TimerHandle) and not o.cancelled())


def _objects_of(class_name: str) -> int:
    return sum(1 for o in gc.get_objects() if type(o).__name__ == class_name)


def _open_clients(b: InProcessBroker, heartbeat_s: int) -> list[RawAMQP]:
    clients = []
    for _ in range(CLIENTS):
        c = RawAMQP("127.0.0.1", b.port)
        c.handshake(heartbeat_s=heartbeat_s)
        c.open_channel(1)
        clients.append(c)
    return clients


def test_idle_connections_with_heartbeats_share_one_timer(tmp_path):
    b = InProcessBroker(tmp_path)
    clients: list[RawAMQP] = []
    try:
        before = b.call(_live_timers)
        clients = _open_clients(b, heartbeat_s=30)
        assert b.call(lambda: len(b.server.sessions.connections)) == CLIENTS
        # One timer per connection before: the loop's heap (and each connection's timer churn) grew with them.
        assert b.call(_live_timers) - before < 5
    finally:
        for c in clients:
            c.close()
        b.stop()


def test_closed_connections_are_freed_without_a_garbage_collection(tmp_path):
    b = InProcessBroker(tmp_path)
    gc.collect()
    gc.disable()  # what is left now is left for a full collection
    try:
        before = b.call(lambda: _objects_of("AMQPProtocol"))
        clients = _open_clients(b, heartbeat_s=30)
        assert b.call(lambda: _objects_of("AMQPProtocol")) - before == CLIENTS
        for c in clients:
            c.send(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
            c.expect(commands.Connection.CloseOk, 0)
            c.close()
        wait_until(lambda: b.call(lambda: not b.server.sessions.connections), what="the connections to go")
        # The transports drop their protocols on the loop's next turns.
        wait_until(lambda: b.call(lambda: _objects_of("AMQPProtocol")) == before, timeout=5,
                   what="the closed connections' protocols to be freed")
    finally:
        gc.enable()
        b.stop()
