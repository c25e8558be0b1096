"""The shovels of one node, and the ``shovel`` parameter component that defines them.

``Shovels`` runs one ``Shovel`` task per definition while started (the server starts it with the
broker and, in a cluster, only on the leader: a follower runs no server). Each shovel runs as the user
who made it (its parameter's creator): on this node it logs in as that user without a password (the
node's internal mechanism, with a token the server gives through ``LocalNode``), and before each
start ``Shovels.authorize`` (the broker's check of the creator's rights, wired by the server) may
refuse it. ``ShovelComponent`` is what the parameters registry calls: ``validate`` raises
ShovelDefinitionError naming the key, ``apply`` (re)starts the shovel, ``remove`` stops it. The registry
keeps the definitions durable and applies them again at boot.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from lavinpy.wire.constants import INTERNAL_MECHANISM
from lavinpy.wire.uri import AMQPURL

from .definition import ShovelDefinition, parse_definition

if TYPE_CHECKING:
    from .worker import Shovel

log = logging.getLogger("lavinpy.shovel")


class ShovelNotFound(LookupError):
    """No shovel of that name in that vhost."""


class LocalNode:
    """Where ``amqp://`` (no host) leads: this node's AMQP listener over loopback.

    A local URI's user and password are used when it names them (``amqp://user:pass@/vhost``);
    otherwise the shovel logs in as the user who made it, with ``token(user)`` under ``mechanism``
    (the server gives its internal mechanism and per-process tokens: no password is involved).
    """

    def __init__(self, host: str, port: int, token: Callable[[str], str],
                 mechanism: str = INTERNAL_MECHANISM) -> None:
        self.host, self.port, self.token, self.mechanism = host, port, token, mechanism

    def url(self, uri: str, vhost: str, user: str) -> AMQPURL:
        u = urlsplit(uri)
        path = u.path[1:] if u.path.startswith("/") else u.path
        target = unquote(path) if path else vhost
        if u.username:
            return AMQPURL(host=self.host, port=self.port, user=unquote(u.username),
                           password=unquote(u.password) if u.password is not None else "", vhost=target)
        return AMQPURL(host=self.host, port=self.port, user=user, password=self.token(user), vhost=target,
                       mechanism=self.mechanism)


class Shovels:
    """The node's shovels by (vhost, name); they run between ``start`` and ``stop``."""

    def __init__(self, local: LocalNode, node_name: str | None = None) -> None:
        self.local = local
        self.node = node_name or f"lavinpy@{socket.gethostname()}"
        self.definitions: dict[tuple[str, str], ShovelDefinition] = {}
        self.creators: dict[tuple[str, str], str] = {}  # whom each shovel runs as
        # (vhost, name) -> why the shovel may not start now (its creator's rights), or None.
        self.authorize: Callable[[str, str], str | None] | None = None
        self.running: dict[tuple[str, str], Shovel] = {}
        # Paused (LavinMQ's pause): defined, not running, listed as "paused" until resumed or restarted.
        # The mark is stored with the shovel's parameter (``store_pause``, given by the server), so a paused
        # shovel stays paused across a restart of the node and on a new leader; ``stored_pause`` reads it
        # back when a definition is put.
        self.paused: set[tuple[str, str]] = set()
        self.store_pause: Callable[[str, str, bool], None] | None = None
        self.stored_pause: Callable[[str, str], bool] = lambda vhost, name: False
        self._stopped: dict[tuple[str, str], Shovel] = {}  # a paused shovel as it stopped: its counters
        # Stops under way (a restart, a new definition, a delete, a pause): the node's stop waits for them.
        self._stopping: set[asyncio.Task[None]] = set()
        self.started = False
        # Called when a shovel with src-delete-after has moved its messages: the registry forgets
        # its parameter then (RabbitMQ deletes the parameter too).
        self.on_finished: Callable[[str, str], None] | None = None

    def _shovel(self, key: tuple[str, str]) -> Shovel:
        user, authorize = self.creators[key], self.authorize

        def local_url(uri: str, vhost: str) -> AMQPURL:
            return self.local.url(uri, vhost, user)

        def refusal() -> str | None:
            return authorize(*key) if authorize is not None else None

        # The worker's code (and its AMQP client) is loaded with the first shovel: a broker without
        # shovels does not keep it in memory.
        from .worker import Shovel

        return Shovel(key[0], key[1], self.definitions[key], local_url, self._finished, refusal)

    def _stop_soon(self, shovel: Shovel) -> None:
        task = asyncio.get_running_loop().create_task(shovel.stop())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    def _launch(self, key: tuple[str, str]) -> None:
        shovel = self._shovel(key)
        self.running[key] = shovel
        shovel.start()

    def _finished(self, shovel: Shovel) -> None:
        key = (shovel.vhost, shovel.name)
        if self.running.get(key) is shovel:
            del self.running[key]
            self.definitions.pop(key, None)
            self.creators.pop(key, None)
            if self.on_finished is not None:
                try:
                    self.on_finished(*key)
                except Exception:
                    log.exception("shovel %s in vhost %s: forgetting its parameter failed", key[1], key[0])

    def start(self) -> None:
        """Start every defined shovel (at boot, or when this node becomes the cluster's leader)."""
        self.started = True
        for key in self.definitions:
            if key not in self.running and key not in self.paused:
                self._launch(key)

    async def stop(self) -> None:
        self.started = False
        running, self.running = list(self.running.values()), {}
        await asyncio.gather(*(shovel.stop() for shovel in running), *self._stopping, return_exceptions=True)

    def put(self, vhost: str, name: str, definition: ShovelDefinition, user: str) -> None:
        """Define (or redefine: restarted with the new definition) a shovel run as ``user``."""
        key = (vhost, name)
        self.definitions[key] = definition
        self.creators[key] = user
        if self.stored_pause(vhost, name):
            self.paused.add(key)
        old = self.running.pop(key, None)
        if old is not None:
            self._stop_soon(old)
        if self.started and key not in self.paused:
            self._launch(key)

    def delete(self, vhost: str, name: str) -> None:
        key = (vhost, name)
        if self.definitions.pop(key, None) is None:
            raise ShovelNotFound(f"no shovel '{name}' in vhost '{vhost}'")
        self.creators.pop(key, None)
        self.paused.discard(key)
        self._stopped.pop(key, None)
        shovel = self.running.pop(key, None)
        if shovel is not None:
            self._stop_soon(shovel)

    def restart(self, vhost: str, name: str) -> None:
        """Stop the shovel and start it again now (RabbitMQ's restart_shovel)."""
        key = (vhost, name)
        if key not in self.definitions:
            raise ShovelNotFound(f"no shovel '{name}' in vhost '{vhost}'")
        self._store_pause(vhost, name, False)
        self.paused.discard(key)
        self._stopped.pop(key, None)
        self.put(vhost, name, self.definitions[key], self.creators[key])

    def _store_pause(self, vhost: str, name: str, paused: bool) -> None:
        """Record the pause durably before acting on it (an error leaves the shovel as it was)."""
        if self.store_pause is not None:
            self.store_pause(vhost, name, paused)

    def pause(self, vhost: str, name: str) -> bool:
        """Stop moving messages until ``resume`` (what is unacknowledged goes back to the source);
        False when it is paused already."""
        key = (vhost, name)
        if key not in self.definitions:
            raise ShovelNotFound(f"no shovel '{name}' in vhost '{vhost}'")
        if key in self.paused:
            return False
        self._store_pause(vhost, name, True)
        self.paused.add(key)
        shovel = self.running.pop(key, None)
        if shovel is not None:
            self._stopped[key] = shovel
            self._stop_soon(shovel)
        log.info("shovel %s in vhost %s paused", name, vhost)
        return True

    def resume(self, vhost: str, name: str) -> bool:
        """Run a paused shovel again; False when it is not paused."""
        key = (vhost, name)
        if key not in self.definitions:
            raise ShovelNotFound(f"no shovel '{name}' in vhost '{vhost}'")
        if key not in self.paused:
            return False
        self._store_pause(vhost, name, False)
        self.paused.discard(key)
        self._stopped.pop(key, None)
        if self.started and key not in self.running:
            self._launch(key)
        log.info("shovel %s in vhost %s resumed", name, vhost)
        return True

    def status(self, vhost: str | None = None) -> list[dict[str, Any]]:
        """RabbitMQ's /api/shovels rows (defined shovels not running here, e.g. stopped, are listed as
        terminated)."""
        rows = []
        for v, name in sorted(self.definitions):
            if vhost is not None and v != vhost:
                continue
            shovel = self.running.get((v, name))
            if (v, name) in self.paused:
                row = (self._stopped.get((v, name)) or self._shovel((v, name))).status(self.node)
                row["state"] = "paused"
                row.pop("reason", None)
                rows.append(row)
                continue
            if shovel is None:
                shovel = self._shovel((v, name))
                shovel.state, shovel.reason = "terminated", "not running on this node"
            rows.append(shovel.status(self.node))
        return rows


class ShovelComponent:
    """The ``shovel`` component of /api/parameters/shovel/{vhost}/{name} (RabbitMQ's dynamic shovels)."""

    name = "shovel"

    def __init__(self, shovels: Shovels, creator: Callable[[str, str], str]) -> None:
        """``creator``: (vhost, name) -> the user a stored shovel parameter runs as."""
        self.shovels = shovels
        self.creator = creator

    def validate(self, vhost: str, name: str, value: dict) -> None:
        parse_definition(value)

    def apply(self, vhost: str, name: str, value: dict) -> None:
        self.shovels.put(vhost, name, parse_definition(value), self.creator(vhost, name))

    def remove(self, vhost: str, name: str) -> None:
        try:
            self.shovels.delete(vhost, name)
        except ShovelNotFound:
            pass  # removing what is not running is done already
