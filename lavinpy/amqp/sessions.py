"""The session layer's shared state: live connections, direct reply-to, output scheduling.

The broker (the model) knows nothing of connections; it reaches them through the
``SessionLayer`` protocol it defines, which ``Sessions`` implements: resource alarms and a deleted
vhost. When deliveries and output run is the model's (``broker.scheduler``): a connection with output
waiting registers itself there, and the end of each input batch runs the deliveries it made possible
(their output, with the batch's replies, is written by the turn).

Periodic work looks only at the connections it concerns, so that idle connections cost (almost) nothing:
heartbeats run on one wheel of HEARTBEAT_TICK slots (one loop timer for all connections, each connection
visited once per heartbeat/2), and the consumer-timeout sweep visits only the connections that have
consumed or fetched (``consuming``), not every connection's channels four times a second.

No event loop and no files here: the adapter that runs the sessions (the server, on asyncio; a
test, by hand) provides the timers and tasks (``Scheduling``) and the connections' body spools.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from ..broker.ops import RESOURCE_CHECK_BYTES, Broker
from ..broker.ops.refill import init_refill
from ..wire.accel import cwire
from ..wire.constants import CONNECTION_FORCED
from ..wire.reader import FrameReader
from . import consumer_timeout, session_views
from .channel import Channel
from .connection import OPEN, AMQPConnection
from .output import INPUT_TURN_BYTES

if TYPE_CHECKING:
    from .output import ConnectionOutput
    from .spool import BodySpool

log = logging.getLogger("lavinpy.sessions")


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Scheduling(Protocol):
    """What the session layer needs of its event loop (the model's turns ask the loop themselves:
    ``broker.scheduler``)."""

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        """Run ``callback`` in ``delay`` seconds, unless cancelled."""

    def start_task(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` (waiting for the store, say) alongside; its errors are the adapter's to log."""


HEARTBEAT_TICK = 0.25  # seconds: a connection's heartbeat check runs at most this late


class HeartbeatWatched(Protocol):
    """A connection, as the heartbeat wheel sees it."""

    heartbeat_slot: int | None  # the wheel slot it waits in (None: not watched)

    def heartbeat_due(self, now: float) -> None:
        """Its heartbeat check is due: send one, close a silent client, or ``watch_heartbeat`` again."""




class Sessions:
    def __init__(self, broker: Broker, scheduling: Scheduling, new_spool: Callable[[], BodySpool]) -> None:
        """``new_spool``: a new body spool for a connection (files in the data dir)."""
        self.broker = broker
        self.connections: set[AMQPConnection] = set()
        # The connections that sent basic.consume or basic.get: only these can hold unacked deliveries.
        self.consuming: set[AMQPConnection] = set()
        # Heartbeat wheel: slot (due time // HEARTBEAT_TICK, rounded up) -> the connections due then.
        self._heartbeat_slots: dict[int, set[HeartbeatWatched]] = {}
        self._heartbeat_timer: TimerHandle | None = None
        # Direct reply-to: reply key -> the requester's channel.
        self.reply_to: dict[str, Channel] = {}
        # A connection with output waiting is run by the model's next turn (ConnectionOutput.run_pending).
        self.schedule_output: Callable[[ConnectionOutput], None] = broker.scheduler.schedule
        # A connection's reader thread held input the loop had not taken when it last took some (the
        # driver sets it): the next turn brings more deliveries, so small output may wait for them.
        self.input_waiting = False
        self._scheduling = scheduling
        self._new_spool = new_spool
        self._sweep_timer: TimerHandle | None = None
        broker.sessions = self

    def new_spool(self) -> BodySpool:
        """A body spool for one connection's large incoming bodies."""
        return self._new_spool()

    def start_task(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` alongside, on the adapter's loop (the sessions start no tasks of their own)."""
        self._scheduling.start_task(work)

    # --- SessionLayer (called by the broker) ---------------------------------------------------
    def connection_started(self, connection: AMQPConnection) -> None:
        self.connections.add(connection)
        self.broker.connections.register(connection, session_views.AMQPClientConnection(connection))

    def connection_lost(self, connection: AMQPConnection) -> None:
        self.connections.discard(connection)
        self.consuming.discard(connection)
        self.broker.connections.unregister(connection)

    def resources_changed(self, reason: str | None) -> None:
        for connection in list(self.connections):
            connection.set_blocked(reason)

    def close_vhost_connections(self, vhost: str, reason: str) -> None:
        for connection in list(self.connections):
            if connection.vhost is not None and connection.vhost.name == vhost:
                connection.close(CONNECTION_FORCED, f"CONNECTION_FORCED - {reason}")
                connection.teardown()  # exclusive queues go before the vhost closes

    # --- pending work ---------------------------------------------------------------------------
    def run_pending(self) -> None:
        """The model's turn now: deliveries, then every connection's output."""
        self.broker.scheduler.run()

    def end_of_input(self) -> None:
        """The end of an input batch: the deliveries it made possible run now (a publisher's flood must
        not starve the consumers), and their output, like the batch's replies, is written by the loop's
        next turn, after every other socket's input of this poll was read. So a consumer connection gets
        one write per turn of the loop for all its deliveries, however many acks of other consumers (each
        freeing room and delivering) arrived in that poll; the turn follows at once (``call_soon``), before
        the loop waits for more input."""
        scheduler = self.broker.scheduler
        if scheduler.queues:  # (most reads of consumers' acks leave none: a call less per read)
            scheduler.run_deliveries()

    # --- consumer timeouts ----------------------------------------------------------------------
    def start(self) -> None:
        """Start the consumer-timeout sweep, every SWEEP_INTERVAL seconds until ``close``."""
        self._sweep_timer = self._scheduling.call_later(consumer_timeout.SWEEP_INTERVAL, self._sweep_consumer_timeouts)

    def _sweep_consumer_timeouts(self) -> None:
        try:
            consumer_timeout.sweep(self.consuming, self.broker.config.consumer_timeout)
        except Exception:  # pragma: no cover - a bug here must not stop the sweeps
            log.exception("consumer timeout sweep failed")
        if self._sweep_timer is not None:  # not closed meanwhile
            self._sweep_timer = self._scheduling.call_later(consumer_timeout.SWEEP_INTERVAL,
                                                            self._sweep_consumer_timeouts)

    # --- heartbeats -----------------------------------------------------------------------------
    def watch_heartbeat(self, connection: HeartbeatWatched, due: float) -> None:
        """Call ``connection.heartbeat_due`` once at (or up to a tick after) ``due`` (time.monotonic)."""
        self.unwatch_heartbeat(connection)
        slot = int(due / HEARTBEAT_TICK) + 1
        connection.heartbeat_slot = slot
        waiting = self._heartbeat_slots.get(slot)
        if waiting is None:
            waiting = self._heartbeat_slots[slot] = set()
        waiting.add(connection)
        if self._heartbeat_timer is None:
            self._heartbeat_timer = self._scheduling.call_later(HEARTBEAT_TICK, self._heartbeat_sweep)

    def unwatch_heartbeat(self, connection: HeartbeatWatched) -> None:
        slot, connection.heartbeat_slot = connection.heartbeat_slot, None
        if slot is not None:
            waiting = self._heartbeat_slots.get(slot)
            if waiting is not None:
                waiting.discard(connection)
                if not waiting:
                    del self._heartbeat_slots[slot]

    def _heartbeat_sweep(self) -> None:
        """One tick of the wheel: the connections whose slot has come; the timer runs while any wait."""
        self._heartbeat_timer = None
        now = time.monotonic()
        current = int(now / HEARTBEAT_TICK)
        slots = self._heartbeat_slots
        for slot in sorted(s for s in slots if s <= current):
            for connection in slots.pop(slot):
                connection.heartbeat_slot = None
                try:
                    connection.heartbeat_due(now)
                except Exception:  # pragma: no cover - a bug in one must not stop the others' heartbeats
                    log.exception("heartbeat check failed")
        if slots and self._heartbeat_timer is None:  # (a connection watched again may have set it)
            self._heartbeat_timer = self._scheduling.call_later(HEARTBEAT_TICK, self._heartbeat_sweep)

    def close(self) -> None:
        if self._sweep_timer is not None:
            self._sweep_timer.cancel()
            self._sweep_timer = None
        if self._heartbeat_timer is not None:
            self._heartbeat_timer.cancel()
            self._heartbeat_timer = None
        self._heartbeat_slots.clear()


if cwire is not None:
    # A consumer's read of in-order basic.acks in one compiled call (_cwire_ack_read.c), for exactly these
    # classes (their receive_data, end_of_input, note_input and count_input_turn are what it inlines); its
    # pure twin is AMQPConnection.receive_data itself.
    cwire.init_ack_read(AMQPConnection, FrameReader, Sessions, Broker, OPEN, INPUT_TURN_BYTES, RESOURCE_CHECK_BYTES)
    # A consumer's freed window refilled from its queue's backlog in one compiled call (_cwire_refill.c):
    # for consumers on this session layer's channels (their can_deliver is what it inlines).
    init_refill(Channel)
