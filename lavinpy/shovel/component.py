"""The shovels of one node, and the ``shovel`` parameter component that defines them.

``Shovels`` runs one ``Shovel`` task per definition while started (the server starts it with the
broker and, in a cluster, only on the leader: a follower runs no server). ``ShovelComponent`` is
what the parameters registry calls: ``validate`` raises ShovelDefinitionError naming the key,
``apply`` (re)starts the shovel, ``remove`` stops it. The registry keeps the definitions durable and
applies them again at boot.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote, urlsplit

from lavinpy.wire.uri import AMQPURL

from .definition import ShovelDefinition, parse_definition
from .worker import Shovel

log = logging.getLogger("lavinpy.shovel")


class ShovelNotFound(LookupError):
    """No shovel of that name in that vhost."""


class LocalNode:
    """Where ``amqp://`` (no host) leads: this node's AMQP listener over loopback.

    A local URI's user and password are used when it names them (``amqp://user:pass@/vhost``);
    otherwise the broker's configured default user, which may log in from loopback.
    """

    def __init__(self, host: str, port: int, user: str, password: str) -> None:
        self.host, self.port, self.user, self.password = host, port, user, password

    def url(self, uri: str, vhost: str) -> AMQPURL:
        u = urlsplit(uri)
        path = u.path[1:] if u.path.startswith("/") else u.path
        return AMQPURL(host=self.host, port=self.port,
                       user=unquote(u.username) if u.username else self.user,
                       password=unquote(u.password) if u.password is not None else self.password,
                       vhost=unquote(path) if path else vhost)


class Shovels:
    """The node's shovels by (vhost, name); they run between ``start`` and ``stop``."""

    def __init__(self, local: LocalNode, node_name: str | None = None) -> None:
        self.local = local
        self.node = node_name or f"lavinpy@{socket.gethostname()}"
        self.definitions: dict[tuple[str, str], ShovelDefinition] = {}
        self.running: dict[tuple[str, str], Shovel] = {}
        self.started = False
        # Called when a shovel with src-delete-after has moved its messages: the registry forgets
        # its parameter then (RabbitMQ deletes the parameter too).
        self.on_finished: Callable[[str, str], None] | None = None

    def _launch(self, key: tuple[str, str]) -> None:
        shovel = Shovel(key[0], key[1], self.definitions[key], self.local.url, self._finished)
        self.running[key] = shovel
        shovel.start()

    def _finished(self, shovel: Shovel) -> None:
        key = (shovel.vhost, shovel.name)
        if self.running.get(key) is shovel:
            del self.running[key]
            self.definitions.pop(key, None)
            if self.on_finished is not None:
                try:
                    self.on_finished(*key)
                except Exception:
                    log.exception("shovel %s in vhost %s: forgetting its parameter failed", key[1], key[0])

    def start(self) -> None:
        """Start every defined shovel (at boot, or when this node becomes the cluster's leader)."""
        self.started = True
        for key in self.definitions:
            if key not in self.running:
                self._launch(key)

    async def stop(self) -> None:
        self.started = False
        running, self.running = list(self.running.values()), {}
        await asyncio.gather(*(shovel.stop() for shovel in running), return_exceptions=True)

    def put(self, vhost: str, name: str, definition: ShovelDefinition) -> None:
        """Define (or redefine: restarted with the new definition) a shovel."""
        key = (vhost, name)
        self.definitions[key] = definition
        old = self.running.pop(key, None)
        if old is not None:
            asyncio.get_running_loop().create_task(old.stop())
        if self.started:
            self._launch(key)

    def delete(self, vhost: str, name: str) -> None:
        key = (vhost, name)
        if self.definitions.pop(key, None) is None:
            raise ShovelNotFound(f"no shovel '{name}' in vhost '{vhost}'")
        shovel = self.running.pop(key, None)
        if shovel is not None:
            asyncio.get_running_loop().create_task(shovel.stop())

    def restart(self, vhost: str, name: str) -> None:
        """Stop the shovel and start it again now (RabbitMQ's restart_shovel)."""
        key = (vhost, name)
        if key not in self.definitions:
            raise ShovelNotFound(f"no shovel '{name}' in vhost '{vhost}'")
        self.put(vhost, name, self.definitions[key])

    def status(self, vhost: str | None = None) -> list[dict[str, Any]]:
        """RabbitMQ's /api/shovels rows (defined shovels not running here, e.g. stopped, are listed as
        terminated)."""
        rows = []
        for (v, name), definition in sorted(self.definitions.items()):
            if vhost is not None and v != vhost:
                continue
            shovel = self.running.get((v, name))
            if shovel is None:
                shovel = Shovel(v, name, definition, self.local.url)
                shovel.state, shovel.reason = "terminated", "not running on this node"
            rows.append(shovel.status(self.node))
        return rows


class ShovelComponent:
    """The ``shovel`` component of /api/parameters/shovel/{vhost}/{name} (RabbitMQ's dynamic shovels)."""

    name = "shovel"

    def __init__(self, shovels: Shovels) -> None:
        self.shovels = shovels

    def validate(self, vhost: str, name: str, value: dict) -> None:
        parse_definition(value)

    def apply(self, vhost: str, name: str, value: dict) -> None:
        self.shovels.put(vhost, name, parse_definition(value))

    def remove(self, vhost: str, name: str) -> None:
        try:
            self.shovels.delete(vhost, name)
        except ShovelNotFound:
            pass  # removing what is not running is done already
