"""The node's federation links, and the ``federation-upstream`` / ``federation-upstream-set`` components.

``Federation`` keeps the upstreams and sets of every vhost and, while started, one ExchangeLink per
federated exchange (an exchange whose policy has ``federation-upstream`` or ``federation-upstream-set``)
and upstream. What the node knows of its exchanges (which are federated, their bindings, the cluster
name, the creator's rights) is given by the server as plain functions: this package talks to brokers,
this one included, over AMQP only. The links are compared with the policies at every change of a
parameter and every second (a policy or an exchange made or deleted). Each link logs in here as the
user who made its upstream parameter, as a shovel does.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import socket
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from lavinpy.wire.uri import AMQPURL

from .upstream import Upstream, UpstreamError, check_upstream_set, parse_upstream, resolve

if TYPE_CHECKING:
    from .link import BindingSpec, ExchangeLink
    from .queue_link import QueueLink

log = logging.getLogger("lavinpy.federation")

RECONCILE_SECONDS = 1.0
LinkKey = tuple[str, str, str, str]  # "exchange" or "queue", vhost, federated exchange or queue, upstream name
Federated = dict[tuple[str, str, str], Mapping[str, Any]]  # (kind, vhost, name) -> its policy's definition


class LinkNotFound(LookupError):
    """No federation link of that id in that vhost."""


def _nothing() -> Federated:
    return {}


class Federation:
    """The node's upstreams, sets and links; the links run between ``start`` and ``stop``."""

    def __init__(self, local_url: Callable[[str, str, str], AMQPURL], node_name: str | None = None) -> None:
        """``local_url(uri, vhost, user)``: how a link logs in to this node as ``user``."""
        self.local_url = local_url
        self.node = node_name or f"lavinpy@{socket.gethostname()}"
        self.upstreams: dict[tuple[str, str], Upstream] = {}
        self.creators: dict[tuple[str, str], str] = {}
        self.sets: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self.links: dict[LinkKey, ExchangeLink | QueueLink] = {}
        # What a policy names that does not exist (an upstream, a set, a set's member): shown as a link in
        # error, so the status says why nothing runs; it is looked for again at each comparison.
        self.missing: dict[LinkKey, str] = {}
        # Given by the server: the federated exchanges and queues with their policy's definition, an
        # exchange's description and bindings, a queue's consumers and ready messages, the cluster name,
        # and why a link's creator may not run it (vhost, upstream, kind, name).
        self.federated: Callable[[], Federated] = _nothing
        self.exchange_info: Callable[[str, str], dict[str, Any] | None] = lambda vhost, name: None
        self.bindings: Callable[[str, str], list[BindingSpec]] = lambda vhost, name: []
        self.queue_state: Callable[[str, str], tuple[int, int] | None] = lambda vhost, name: None
        self.cluster_name: Callable[[], str] = lambda: self.node
        self.authorize: Callable[[str, str, str, str], str | None] | None = None
        self.started = False
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ parameters

    def put_upstream(self, vhost: str, name: str, upstream: Upstream, user: str) -> None:
        self.upstreams[(vhost, name)] = upstream
        self.creators[(vhost, name)] = user
        self.reconcile()

    def delete_upstream(self, vhost: str, name: str) -> None:
        self.upstreams.pop((vhost, name), None)
        self.creators.pop((vhost, name), None)
        self.reconcile()

    def put_set(self, vhost: str, name: str, members: list[dict[str, Any]]) -> None:
        self.sets[(vhost, name)] = members
        self.reconcile()

    def delete_set(self, vhost: str, name: str) -> None:
        self.sets.pop((vhost, name), None)
        self.reconcile()

    # -------------------------------------------------------------------- links

    def start(self) -> None:
        self.started = True
        self.reconcile()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._watch(), name="federation links")

    async def stop(self) -> None:
        self.started = False
        self.missing = {}
        if self._task is not None:
            self._task.cancel()
            self._task = None
        links, self.links = list(self.links.values()), {}
        await asyncio.gather(*(link.stop() for link in links), return_exceptions=True)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(RECONCILE_SECONDS)
            try:
                self.reconcile()
            except Exception:  # the next round tries again
                log.exception("federation: comparing links with policies failed")

    def wanted(self) -> dict[LinkKey, Upstream]:
        """The links the policies ask for now."""
        wanted: dict[LinkKey, Upstream] = {}
        missing_now: dict[LinkKey, str] = {}
        for (kind, vhost, name), definition in self.federated().items():
            upstreams = {n: u for (v, n), u in self.upstreams.items() if v == vhost}
            sets = {n: s for (v, n), s in self.sets.items() if v == vhost}
            found, missing = resolve(definition, upstreams, sets)
            for what in missing:
                missing_now[(kind, vhost, name, what.partition("'")[2].rstrip("'"))] = (
                    f"no {what} in vhost '{vhost}'")
            for upstream in found:
                wanted[(kind, vhost, name, upstream.name)] = upstream
        for key, why in missing_now.items():
            if key not in self.missing:
                log.warning("federation of %s %s in vhost %s: %s", key[0], key[2], key[1], why)
        self.missing = missing_now
        return wanted

    def reconcile(self) -> None:
        if not self.started:
            return
        wanted = self.wanted()
        loop = asyncio.get_running_loop()
        for key in [k for k, link in self.links.items() if wanted.get(k) != link.upstream]:
            loop.create_task(self.links.pop(key).stop(cleanup=key not in wanted))
        for key, upstream in wanted.items():
            if key not in self.links:
                self._launch(key, upstream)

    def _launch(self, key: LinkKey, upstream: Upstream) -> None:
        kind, vhost, target, name = key
        user = self.creators.get((vhost, name), "")

        def refusal() -> str | None:
            return self.authorize(vhost, name, kind, target) if self.authorize is not None else None

        def local_url(uri: str) -> AMQPURL:
            return self.local_url(uri, vhost, user)

        # The links' code (and their AMQP client) is loaded with the first link: a broker without
        # federation does not keep it in memory.
        from .link import ExchangeLink, LinkEnv
        from .queue_link import QueueEnv, QueueLink

        link: ExchangeLink | QueueLink
        if kind == "queue":
            link = QueueLink(vhost, target, upstream, QueueEnv(
                local_url=local_url, queue=lambda: self.queue_state(vhost, target), refusal=refusal))
        else:
            link = ExchangeLink(vhost, target, upstream, LinkEnv(
                local_url=local_url, cluster_name=self.cluster_name,
                exchange=lambda: self.exchange_info(vhost, target),
                bindings=lambda: self.bindings(vhost, target), refusal=refusal))
        self.links[key] = link
        link.start()

    @staticmethod
    def link_id(key: LinkKey) -> str:
        return hashlib.sha1("\0".join(key).encode()).hexdigest()[:8]

    def status(self, vhost: str | None = None) -> list[dict[str, Any]]:
        """RabbitMQ's /api/federation-links rows."""
        rows = [link.status(self.node, self.link_id(key)) for key, link in sorted(self.links.items())
                if vhost is None or key[1] == vhost]
        for key, why in sorted(self.missing.items()):
            kind, link_vhost, name, upstream = key
            if vhost is None or link_vhost == vhost:
                rows.append({"node": self.node, kind: name, "type": kind, "vhost": link_vhost, "upstream": upstream,
                             "id": self.link_id(key), "status": "error", "error": why, "timestamp": "", "uri": "",
                             f"upstream_{kind}": "", "messages_received": 0, "messages_forwarded": 0})
        return rows

    def restart(self, vhost: str, link_id: str) -> None:
        """Stop the link and start it again now (RabbitMQ's restart_federation_link)."""
        for key, link in list(self.links.items()):
            if key[1] == vhost and self.link_id(key) == link_id:
                asyncio.get_running_loop().create_task(link.stop())
                self._launch(key, link.upstream)
                return
        raise LinkNotFound(f"no federation link '{link_id}' in vhost '{vhost}'")


class UpstreamComponent:
    """The ``federation-upstream`` component of /api/parameters."""

    name = "federation-upstream"

    def __init__(self, federation: Federation, creator: Callable[[str, str], str]) -> None:
        self.federation, self.creator = federation, creator

    def validate(self, vhost: str, name: str, value: dict) -> None:
        parse_upstream(name, value)

    def apply(self, vhost: str, name: str, value: dict) -> None:
        self.federation.put_upstream(vhost, name, parse_upstream(name, value), self.creator(vhost, name))

    def remove(self, vhost: str, name: str) -> None:
        self.federation.delete_upstream(vhost, name)


class UpstreamSetComponent:
    """The ``federation-upstream-set`` component of /api/parameters (``all`` needs no parameter)."""

    name = "federation-upstream-set"

    def __init__(self, federation: Federation) -> None:
        self.federation = federation

    def validate(self, vhost: str, name: str, value: Any) -> None:
        check_upstream_set(value)

    def apply(self, vhost: str, name: str, value: Any) -> None:
        self.federation.put_set(vhost, name, check_upstream_set(value))

    def remove(self, vhost: str, name: str) -> None:
        self.federation.delete_set(vhost, name)


__all__ = ["Federation", "LinkNotFound", "UpstreamComponent", "UpstreamError", "UpstreamSetComponent"]
