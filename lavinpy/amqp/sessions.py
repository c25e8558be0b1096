"""The session layer's shared state: live connections, direct reply-to, output scheduling.

The broker (the model) knows nothing of connections; it reaches them through the
``SessionLayer`` protocol it defines, which ``Sessions`` implements: pending deliveries and
resource alarms. Work queued by any connection (deliveries, output) runs once per input batch.

No event loop and no files here: the adapter that runs the sessions (the server, on asyncio; a
test, by hand) provides the scheduling (``Scheduling``) and the connections' body spools.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from ..broker.broker import ConnectionCounts
from ..wire.constants import CONNECTION_FORCED
from . import consumer_timeout
from .connection_states import OPEN

if TYPE_CHECKING:
    from ..broker.broker import Broker
    from .channel import Channel
    from .connection import AMQPConnection
    from .output import ConnectionOutput
    from .spool import BodySpool

log = logging.getLogger("lavinpy.sessions")


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Scheduling(Protocol):
    """What the session layer needs of its event loop."""

    def call_soon(self, callback: Callable[[], None]) -> object:
        """Run ``callback`` once the current callback (a batch of input, a timer) is done."""

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        """Run ``callback`` in ``delay`` seconds, unless cancelled."""

    def start_task(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` (waiting for the store, say) alongside; its errors are the adapter's to log."""


PROTOCOL_LABEL = "amqp091"  # RabbitMQ's label of AMQP 0-9-1 in its per-protocol metrics


class Sessions:
    def __init__(self, broker: Broker, scheduling: Scheduling, new_spool: Callable[[], BodySpool]) -> None:
        """``new_spool``: a new body spool for a connection (files in the data dir)."""
        self.broker = broker
        self.connections: set[AMQPConnection] = set()
        # Direct reply-to: reply key -> the requester's channel.
        self.reply_to: dict[str, Channel] = {}
        self.output_pending: set[ConnectionOutput] = set()
        self._scheduled = False
        self._call_soon = scheduling.call_soon
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
    def work_pending(self) -> None:
        self._schedule()

    def resources_changed(self, reason: str | None) -> None:
        for connection in list(self.connections):
            connection.set_blocked(reason)

    def close_vhost_connections(self, vhost: str, reason: str) -> None:
        for connection in list(self.connections):
            if connection.vhost is not None and connection.vhost.name == vhost:
                connection.close(CONNECTION_FORCED, f"CONNECTION_FORCED - {reason}")
                connection.teardown()  # exclusive queues go before the vhost closes
        self._schedule()  # the close frames go out now

    def connection_counts(self) -> dict[str, ConnectionCounts]:
        connections = list(self.connections)
        logged_in = publishers = consumers = 0
        for conn in connections:
            if conn.state == OPEN and conn.vhost is not None:
                logged_in += 1
            for channel in list(conn.channels.values()):
                publishers += channel.is_publisher
                consumers += len(channel.consumers)
        return {PROTOCOL_LABEL: ConnectionCounts(len(connections), logged_in, publishers, consumers)}

    # --- pending work ---------------------------------------------------------------------------
    def schedule_output(self, connection: ConnectionOutput) -> None:
        self.output_pending.add(connection)
        self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self._call_soon(self.run_pending)

    def run_pending(self) -> None:
        """Deliveries first, then every connection's output in one write each."""
        self._scheduled = False
        self.broker.run_deliveries()
        if self.output_pending:
            connections, self.output_pending = self.output_pending, set()
            for connection in connections:
                connection.flush_output()

    # --- consumer timeouts ----------------------------------------------------------------------
    def start(self) -> None:
        """Start the consumer-timeout sweep, every SWEEP_INTERVAL seconds until ``close``."""
        self._sweep_timer = self._scheduling.call_later(consumer_timeout.SWEEP_INTERVAL, self._sweep_consumer_timeouts)

    def _sweep_consumer_timeouts(self) -> None:
        try:
            if consumer_timeout.sweep(self.connections, self.broker.config.consumer_timeout):
                self._schedule()  # the channel.close frames go out now
        except Exception:  # pragma: no cover - a bug here must not stop the sweeps
            log.exception("consumer timeout sweep failed")
        if self._sweep_timer is not None:  # not closed meanwhile
            self._sweep_timer = self._scheduling.call_later(consumer_timeout.SWEEP_INTERVAL,
                                                            self._sweep_consumer_timeouts)

    def close(self) -> None:
        if self._sweep_timer is not None:
            self._sweep_timer.cancel()
            self._sweep_timer = None
