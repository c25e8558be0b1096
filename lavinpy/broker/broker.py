"""The broker: the data directory, users, and every vhost."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ..config import parse_watermark
from ..store import changes
from ..store.changes import FileChanges, ReplicationBarrier
from ..store.datadir import DataDir
from .access.client_limits import USER_LIMITS_FILE, ClientLimits
from .access.internal_login import LINK_CREATORS_FILE, InternalLogins
from .access.login_throttle import LoginThrottle
from .access.users import UserStore
from .alarms import alarm_reason
from .connections import ConnectionCounts, ConnectionRegistry, all_protocols
from .login import Logins
from .metrics.stats import NodeCounters, StatsSampler
from .scheduler import DeliveryScheduler
from .settings.parameters import GLOBAL_PARAMETERS_FILE, PARAMETERS_FILE, Parameters
from .vhost import VHost

__all__ = ["Broker", "ConnectionCounts", "Face", "SessionLayer", "all_protocols"]

if TYPE_CHECKING:
    from ..config import Config

log = logging.getLogger("lavinpy.broker")

# Input bytes (all connections) after which the resource alarms are re-checked at once, instead
# of waiting for the periodic check: a burst of publishes is seen before the next read.
RESOURCE_CHECK_BYTES = 16 * 1024 * 1024


class SessionLayer(Protocol):
    """What the model asks of the session layer above it (which implements this); when deliveries
    run is the model's own (``Broker.scheduler``)."""

    def resources_changed(self, reason: str | None) -> None:
        """A resource alarm was raised (reason) or cleared (None): block or unblock publishers."""

    def close_vhost_connections(self, vhost: str, reason: str) -> None:
        """The vhost goes away: close its connections with 320 and release their channels now."""


class Face(Protocol):
    """What the model asks of each face's sessions (the server registers every face with its
    ``SessionLayer``); their connections are in ``Broker.connections``, their traffic counted by the
    model's operations (``stats.ProtocolCounters``)."""

    def resources_changed(self, reason: str | None) -> None:
        """A resource alarm was raised (reason) or cleared (None): block or unblock publishers."""

    def close_vhost_connections(self, vhost: str, reason: str) -> None:
        """The vhost goes away: close its connections now."""


class _NoSessions:
    """Until a session layer attaches: nobody to block."""

    def resources_changed(self, reason: str | None) -> None:
        pass

    def close_vhost_connections(self, vhost: str, reason: str) -> None:
        pass


class Broker:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.datadir = DataDir(Path(config.data_dir))
        self.users: UserStore | None = None
        self.login_throttle = LoginThrottle(free_failures=config.login_free_failures)
        # The node's own shovels log in to it as their creators (token creators' rights kept in a file).
        self.internal_logins = InternalLogins(self.datadir.path / LINK_CREATORS_FILE)
        self.logins = Logins(self)  # the one login operation of every face
        self.vhosts: dict[str, VHost] = {}
        # Set while a resource alarm blocks publishers (connection.blocked); None when clear.
        self.blocked_reason: str | None = None
        # When deliveries run: the queues with deliveries to make and the faces' connections with output
        # waiting, run in one callback of the loop (and at the end of a face's input batch).
        self.scheduler = DeliveryScheduler()
        self.sessions: SessionLayer = _NoSessions()
        self.connections = ConnectionRegistry()  # every face's client connections (the API reads them here)
        self._input_since_check = 0
        self.stats = StatsSampler(self, config.stats_sample_interval)  # message counts and rates
        self.node_counters = NodeCounters()  # churn, empty gets, message sizes (read by the metrics)
        self._replication_barrier: ReplicationBarrier | None = None
        # Runtime parameters with their components (vhost-limits here; the server registers shovel),
        # and the vhost and user limits with the counts they are checked against.
        self.parameters = Parameters(self.datadir.path / PARAMETERS_FILE, self.datadir.path / GLOBAL_PARAMETERS_FILE)
        self.client_limits = ClientLimits(self.datadir.path / USER_LIMITS_FILE)
        self.client_limits.vhost_limits_changed = self._vhost_limits_changed
        self.parameters.register(self.client_limits)

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
        self.parameters.vhost_exists = self.users.vhost_exists
        self.internal_logins.load()  # before the links start: they may be a token user's
        self.parameters.load()
        self.client_limits.load()

    def open_vhost(self, name: str, unclean: bool = False) -> VHost:
        vhost = VHost(name, self.datadir.vhost_path(name, create=True), self.config, self)
        vhost.store.barrier = self._replication_barrier
        vhost.open(unclean_stop=unclean)
        vhost.max_queues = self.client_limits.max_queues(name)
        self.vhosts[name] = vhost
        return vhost

    def _vhost_limits_changed(self, name: str) -> None:
        vhost = self.vhosts.get(name)
        if vhost is not None:
            vhost.max_queues = self.client_limits.max_queues(name)

    def set_replication(self, listener: FileChanges | None, barrier: ReplicationBarrier | None) -> None:
        """A replication leader: report every durable file change to ``listener``, and make every
        vhost's flushes (confirms, tx.commit-ok, declare-ok) wait for ``barrier``. None, None detaches."""
        self._replication_barrier = barrier
        changes.attach(self.datadir.path, listener)
        for vhost in self.vhosts.values():
            vhost.store.barrier = barrier

    async def wait_replicated(self) -> None:
        """Resolve once every in-sync follower holds what was written before the call (at once when
        this broker leads no cluster), and the definitions appended are on disk per the fsync policy:
        the HTTP API's changes wait for it as AMQP's -ok replies do."""
        for vhost in list(self.vhosts.values()):
            pending = vhost.definitions_pending()
            if pending is not None:
                await asyncio.shield(pending)
        if self._replication_barrier is not None:
            await self._replication_barrier.wait_replicated()

    def _users_changed(self) -> None:
        users = self.users
        if users is not None:  # a deleted vhost's parameters and a deleted user's limits go with it
            for vhost in {p["vhost"] for p in self.parameters.listing()}:
                if not users.vhost_exists(vhost):
                    self.parameters.drop_vhost(vhost)
            for user in list(self.client_limits.user_limits):
                if users.user(user) is None:
                    self.client_limits.drop_user(user)
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
        self.stats.start()

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
        """Change the alarm thresholds at run time (the HTTP API's PUT /api/nodes/{name}/..., which
        lavinpyctl's set_vm_memory_high_watermark and set_disk_free_limit call); the alarm is
        re-evaluated at once. Not written back to the configuration file: a restart reads it again."""
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
        self.sessions.resources_changed(reason)

    # --- pending deliveries -----------------------------------------------------------------
    @property
    def serving_guard(self) -> Callable[[], bool] | None:
        """A cluster leader's lease check: False once this node may no longer serve (nothing more is
        delivered; the node is stepping down). None: a single node, always serving."""
        return self.scheduler.serving_guard

    @serving_guard.setter
    def serving_guard(self, guard: Callable[[], bool] | None) -> None:
        self.scheduler.serving_guard = guard

    def close(self) -> None:
        task = getattr(self, "_alarm_task", None)
        if task is not None:
            task.cancel()
        self.login_throttle.close()
        self.logins.close()
        self.stats.stop()
        for vhost in self.vhosts.values():
            vhost.close()
        self.datadir.write_clean_stop_marker()
        self.datadir.close()
