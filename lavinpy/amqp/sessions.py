"""The session layer's shared state: live connections, direct reply-to, output scheduling.

The broker (the model) knows nothing of connections; it reaches them through the
``SessionLayer`` protocol it defines, which ``Sessions`` implements: pending deliveries and
resource alarms. Work queued by any connection (deliveries, output) runs once per input batch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..wire.constants import CONNECTION_FORCED
from . import consumer_timeout

if TYPE_CHECKING:
    from ..broker.broker import Broker
    from .channel import Channel
    from .connection import AMQPConnection
    from .output import ConnectionOutput

log = logging.getLogger("lavinpy.sessions")


class Sessions:
    def __init__(self, broker: Broker, call_soon: Callable[[Callable[[], None]], object] | None = None) -> None:
        self.broker = broker
        self.connections: set[AMQPConnection] = set()
        # Direct reply-to: reply key -> the requester's channel.
        self.reply_to: dict[str, Channel] = {}
        self.output_pending: set[ConnectionOutput] = set()
        self._scheduled = False
        self._call_soon = call_soon
        self._sweep_task: asyncio.Task | None = None
        broker.sessions = self

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

    # --- pending work ---------------------------------------------------------------------------
    def schedule_output(self, connection: ConnectionOutput) -> None:
        self.output_pending.add(connection)
        self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            call_soon = self._call_soon or asyncio.get_running_loop().call_soon
            call_soon(self.run_pending)

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
        """Start the consumer-timeout sweep (needs a running event loop)."""
        self._sweep_task = asyncio.get_running_loop().create_task(self._watch_consumer_timeouts())

    async def _watch_consumer_timeouts(self) -> None:
        while True:
            await asyncio.sleep(consumer_timeout.SWEEP_INTERVAL)
            try:
                if consumer_timeout.sweep(self.connections, self.broker.config.consumer_timeout):
                    self._schedule()  # the channel.close frames go out now
            except Exception:  # pragma: no cover - a bug here must not stop the sweeps
                log.exception("consumer timeout sweep failed")

    def close(self) -> None:
        if self._sweep_task is not None:
            self._sweep_task.cancel()
            self._sweep_task = None
