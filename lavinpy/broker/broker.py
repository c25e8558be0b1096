"""The broker: the data directory, users, and every vhost."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import parse_watermark
from ..store.datadir import DataDir
from . import consumer_timeout
from .alarms import alarm_reason
from .login_throttle import LoginThrottle
from .users import UserStore
from .vhost import VHost

if TYPE_CHECKING:
    from ..config import Config

log = logging.getLogger("lavinpy.broker")

# Input bytes (all connections) after which the resource alarms are re-checked at once, instead
# of waiting for the periodic check: a burst of publishes is seen before the next read.
RESOURCE_CHECK_BYTES = 16 * 1024 * 1024


class Broker:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.datadir = DataDir(Path(config.data_dir))
        self.users: UserStore | None = None
        self.login_throttle = LoginThrottle()
        self.vhosts: dict[str, VHost] = {}
        self.connections: set = set()
        # Direct reply-to: reply key -> (channel, consumer tag) of the requester.
        self.reply_to: dict[str, object] = {}
        # Set while a resource alarm blocks publishers (connection.blocked); None when clear.
        self.blocked_reason: str | None = None
        # Work queued by any connection, done once per input batch (see run_pending).
        self.delivery_pending: set = set()
        self.output_pending: set = set()
        self._pending_scheduled = False
        self._input_since_check = 0

    def open(self) -> None:
        self.datadir.open()
        # Without the marker the last stop was a crash: recovered messages may have been delivered.
        clean = self.datadir.take_clean_stop_marker()
        unclean = any(self.datadir.vhost_dirs()) and not clean
        self.users = UserStore(self.datadir.users_file, self.datadir.vhosts_file)
        self.users.load()
        self.users.ensure_defaults(self.config.default_user, self.config.default_password)
        self.users.subscribe(self._users_changed)
        for vhost in self.users.vhosts():
            self.open_vhost(vhost.name, unclean)

    def open_vhost(self, name: str, unclean: bool = False) -> VHost:
        vhost = VHost(name, self.datadir.vhost_path(name, create=True), self.config, self)
        vhost.open(unclean_stop=unclean)
        self.vhosts[name] = vhost
        return vhost

    def _users_changed(self) -> None:
        # Channels keep the exchange they last published to, permission-checked; a new vhost
        # generation makes them resolve and check it again on their next publish.
        for vhost in self.vhosts.values():
            vhost.generation += 1

    def start(self) -> None:
        """Start the background tasks (needs a running event loop)."""
        for vhost in self.vhosts.values():
            vhost.start_flusher()
        loop = asyncio.get_running_loop()
        self._alarm_task = loop.create_task(self._watch_resources())
        self._timeout_task = loop.create_task(self._watch_consumer_timeouts())

    async def _watch_consumer_timeouts(self) -> None:
        while True:
            await asyncio.sleep(consumer_timeout.SWEEP_INTERVAL)
            try:
                if consumer_timeout.sweep(self.connections, self.config.consumer_timeout):
                    self._schedule()  # the channel.close frames go out now
            except Exception:  # pragma: no cover - a bug here must not stop the sweeps
                log.exception("consumer timeout sweep failed")

    async def _watch_resources(self, interval: float = 2.0) -> None:
        while True:
            self.check_resources()
            await asyncio.sleep(interval)

    def note_input(self, nbytes: int) -> None:
        """Called once per read batch: re-check the alarms when much has come in since the last check."""
        self._input_since_check += nbytes
        if self._input_since_check >= RESOURCE_CHECK_BYTES:
            self.check_resources()

    def set_resource_limits(self, *, memory_high_watermark: str | float | None = None,
                            disk_free_limit: int | None = None) -> None:
        """Change the alarm thresholds at run time (Python API); the alarm is re-evaluated at once."""
        if memory_high_watermark is not None:
            parse_watermark(memory_high_watermark)  # ValueError before anything changes
            self.config.memory_high_watermark = str(memory_high_watermark)
        if disk_free_limit is not None:
            self.config.disk_free_limit = int(disk_free_limit)
        self.check_resources()

    def check_resources(self) -> None:
        """Raise or clear the free-disk and memory alarms; blocked connections follow them."""
        self._input_since_check = 0
        reason = alarm_reason(self.datadir.path, self.config.disk_free_limit,
                              parse_watermark(self.config.memory_high_watermark))
        if reason is None and self.blocked_reason is None:
            return
        if (reason is None) != (self.blocked_reason is None):
            if reason:
                log.warning("resource alarm: %s; blocking publishers", reason)
            else:
                log.info("resource alarm cleared; unblocking publishers")
        self.blocked_reason = reason
        for connection in list(self.connections):
            connection.set_blocked(reason)

    # --- pending work -----------------------------------------------------------------------
    # uvloop may call data_received for one busy socket many times before it runs call_soon
    # callbacks, so deliveries and socket writes also run at the end of every input batch:
    # a publisher flood then cannot starve consumers.
    def schedule_delivery(self, queue: object) -> None:
        self.delivery_pending.add(queue)
        self._schedule()

    def schedule_output(self, connection: object) -> None:
        self.output_pending.add(connection)
        self._schedule()

    def _schedule(self) -> None:
        if not self._pending_scheduled:
            self._pending_scheduled = True
            asyncio.get_running_loop().call_soon(self.run_pending)

    def run_pending(self) -> None:
        self._pending_scheduled = False
        rounds = 0
        while self.delivery_pending and rounds < 4:
            rounds += 1
            queues, self.delivery_pending = self.delivery_pending, set()
            for queue in queues:
                if not queue.deleted and queue.deliver():
                    self.delivery_pending.add(queue)
        if self.delivery_pending:
            self._schedule()
        if self.output_pending:
            connections, self.output_pending = self.output_pending, set()
            for connection in connections:
                connection.flush_output()

    def close(self) -> None:
        for name in ("_alarm_task", "_timeout_task"):
            task = getattr(self, name, None)
            if task is not None:
                task.cancel()
        self.login_throttle.close()
        for vhost in self.vhosts.values():
            vhost.close()
        self.datadir.write_clean_stop_marker()
        self.datadir.close()
