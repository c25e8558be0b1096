"""Removing one of two links that share an upstream queue (test_shared_upstream_queue.py says how they come
to share it): its cleanup must leave the queue and the internal exchange the other link still consumes and
binds through, so that every message confirmed upstream meanwhile arrives downstream and the other link keeps
running. The last link's removal deletes them, as RabbitMQ's cleanup does; a queue another broker's link
still consumes (an upstream consumer this node does not know) is left too.

In process, one lavinpy server being both sides, confirmed messages are published upstream all along."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika

from lavinpy import config as lavinpy_config
from lavinpy.federation.link import ExchangeLink, LinkEnv
from lavinpy.federation.upstream import parse_upstream
from lavinpy.server import Server
from lavinpy.wire.uri import AMQPURL
from tests.helpers import free_port


async def _until(check: Any, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


@dataclass
class Site:
    server: Server
    client: aio_pika.abc.AbstractConnection
    upstream_x: aio_pika.abc.AbstractExchange
    down_q: aio_pika.abc.AbstractQueue
    links: list[ExchangeLink]
    confirmed: list[int] = field(default_factory=list)
    got: list[int] = field(default_factory=list)

    @property
    def vhost(self) -> Any:
        return self.server.broker.vhosts["/"]

    def upstream_objects(self, queue: str) -> set[str]:
        """Which of the shared queue and its internal exchanges A and B exist upstream."""
        names = {queue} & set(self.vhost.queues)
        return names | ({f"{queue} A", f"{queue} B"} & set(self.vhost.exchanges))

    async def publish_all_along(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.upstream_x.publish(aio_pika.Message(str(len(self.confirmed)).encode()), routing_key="")
            self.confirmed.append(len(self.confirmed))  # confirmed: publish returned
            await asyncio.sleep(0.002)

    async def drain(self, also: list[int] | None = None) -> list[int]:
        """The confirmed numbers that reached neither the downstream queue nor ``also`` within 10 s."""
        deadline = time.monotonic() + 10
        while True:
            while (message := await self.down_q.get(no_ack=True, fail=False)) is not None:
                self.got.append(int(message.body))
            missing = sorted(set(self.confirmed) - set(self.got) - set(also or []))
            if not missing or time.monotonic() > deadline:
                return missing
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def _site(workdir: Path, upstream_names: tuple[str, ...], **keys: Any) -> AsyncIterator[Site]:
    """A lavinpy server, upstream exchange up.x federated into down.x (bound to down.q) by one link per
    name, every link on the same upstream URI and exchange (and upstream ``keys``): they share the upstream
    queue."""
    port = free_port()
    cfg = lavinpy_config.load(None, env={}, overrides={
        "data_dir": str(workdir / "data"), "amqp_port": port, "http_port": 0, "prometheus_port": 0, "mqtt_port": 0})
    server = Server(cfg)
    await server.start()
    client = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/")
    links: list[ExchangeLink] = []
    try:
        channel = await client.channel(publisher_confirms=True)
        upstream_x = await channel.declare_exchange("up.x", aio_pika.ExchangeType.FANOUT, durable=True)
        down_x = await channel.declare_exchange("down.x", aio_pika.ExchangeType.FANOUT, durable=True)
        down_q = await channel.declare_queue("down.q", durable=True)
        await down_q.bind(down_x)
        env = LinkEnv(local_url=lambda uri: AMQPURL(port=port), cluster_name=lambda: "down",
                      exchange=lambda: {"type": "fanout", "durable": True, "auto_delete": False, "internal": False,
                                        "arguments": {}},
                      bindings=lambda: [("", {})], refusal=lambda: None)
        uri = f"amqp://guest:guest@127.0.0.1:{port}/"
        links = [ExchangeLink("/", "down.x", parse_upstream(name, {"uri": uri, "exchange": "up.x",
                                                                    "reconnect-delay": 0.2, **keys}), env)
                 for name in upstream_names]
        for link in links:
            link.start()
        await _until(lambda: all(link.state == "running" for link in links), "every link running")
        yield Site(server, client, upstream_x, down_q, links)
    finally:
        for link in links:
            await link.stop()
        await client.close()
        await server.stop()


async def _remove_one_of_two(workdir: Path) -> None:
    async with _site(workdir, ("one", "two")) as site:
        removed, kept = site.links
        queue = kept.status("n", "id")["queue"]
        assert removed.status("n", "id")["queue"] == queue  # the two links share the upstream queue
        stop = asyncio.Event()
        publishing = asyncio.create_task(site.publish_all_along(stop))
        await _until(lambda: len(site.confirmed) > 20, "messages published before the removal")
        await removed.stop(cleanup=True)  # its upstream parameter deleted, or the policy's set changed
        before = len(site.confirmed)
        await _until(lambda: len(site.confirmed) > before + 100, "messages published after the removal")
        state, objects = (kept.state, kept.error), site.upstream_objects(queue)
        consumers = site.vhost.queues[queue].consumer_count if queue in objects else 0
        stop.set()
        await publishing
        missing = await site.drain()
        assert not missing, f"confirmed upstream, lost on the way down: {len(missing)} of {len(site.confirmed)}"
        assert state == ("running", None) and kept.state == "running", (state, kept.error)
        assert len(objects) == 2 and queue in objects  # the queue, and the internal exchange bound to it
        assert consumers == 1  # the kept link's consumer, not cancelled

        await kept.stop(cleanup=True)  # the last link on the queue: it goes upstream, with its exchanges
        assert site.upstream_objects(queue) == set()


def test_removing_one_of_two_links_on_one_upstream_queue_loses_nothing(tmp_path: Path) -> None:
    asyncio.run(_remove_one_of_two(tmp_path))


async def _remove_both_at_once(workdir: Path) -> None:
    async with _site(workdir, ("one", "two")) as site:
        queue = site.links[0].status("n", "id")["queue"]
        assert site.upstream_objects(queue)
        # The policy deleted: both links are removed together, and whichever leaves last deletes.
        await asyncio.gather(*(link.stop(cleanup=True) for link in site.links))
        assert site.upstream_objects(queue) == set()


def test_removing_both_links_on_one_upstream_queue_deletes_it(tmp_path: Path) -> None:
    asyncio.run(_remove_both_at_once(tmp_path))


async def _remove_while_another_broker_consumes(workdir: Path) -> None:
    # The queue named by the upstream's "queue" key: the client here cannot name the default one.
    async with _site(workdir, ("one",), queue="fed.shared") as site:
        link, = site.links
        queue = link.status("n", "id")["queue"]
        assert queue == "fed.shared"
        # Another broker's link on the same upstream queue: a consumer this node's links do not know of.
        other_broker = await site.client.channel()
        theirs: list[int] = []

        async def taken(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            theirs.append(int(message.body))
            await message.ack()
        shared = await other_broker.get_queue(queue, ensure=False)
        await shared.consume(taken)
        stop = asyncio.Event()
        publishing = asyncio.create_task(site.publish_all_along(stop))
        await _until(lambda: len(site.confirmed) > 20, "messages published before the removal")
        await link.stop(cleanup=True)
        before = len(site.confirmed)
        await _until(lambda: len(site.confirmed) > before + 100, "messages published after the removal")
        assert site.upstream_objects(queue) == {queue, f"{queue} {link.suffix}"}  # still consumed, still bound
        stop.set()
        await publishing
        assert not await site.drain(also=theirs), "confirmed upstream, reached neither consumer"
        assert set(theirs) & set(range(before, len(site.confirmed))), "the other broker's link got nothing after"


def test_removing_a_link_leaves_a_queue_another_broker_consumes(tmp_path: Path) -> None:
    asyncio.run(_remove_while_another_broker_consumes(tmp_path))


async def _bindings_change_while_sharing(workdir: Path) -> None:
    async with _site(workdir, ("one", "two")) as site:
        first, second = site.links
        queue = first.status("n", "id")["queue"]
        bindings = [("", {})]
        for link in site.links:
            link.env.bindings = lambda: bindings  # type: ignore[method-assign]
        # The later start replaced the internal exchange the earlier one had bound: a binding made here
        # now is kept upstream by both links, on the exchange in use, without either failing.
        bindings.append(("more", {}))
        await asyncio.sleep(1.5)  # three comparisons of the bindings
        assert [(link.state, link.failures) for link in site.links] == [("running", 0), ("running", 0)], (
            first.error, second.error)
        internal = site.upstream_objects(queue) - {queue}
        assert len(internal) == 1
        name = internal.pop()
        keys = sorted(b.routing_key for b in site.vhost.exchanges["up.x"].bindings()
                      if getattr(b.destination, "name", None) == name)
        assert keys == ["", "more"], keys  # both bindings on the exchange in use, once each
        for _ in range(20):
            await site.upstream_x.publish(aio_pika.Message(str(len(site.confirmed)).encode()), routing_key="")
            site.confirmed.append(len(site.confirmed))
        assert not await site.drain()
        await asyncio.sleep(0.3)
        await site.drain()
        assert sorted(site.got) == site.confirmed, "each message once"

        # The link that made the exchange in use removed; the other keeps following the bindings.
        removed = next(link for link in site.links if f"{queue} {link.suffix}" in site.upstream_objects(queue))
        kept = first if removed is second else second
        await removed.stop(cleanup=True)
        bindings.pop()
        await asyncio.sleep(1.5)
        assert (kept.state, kept.failures) == ("running", 0), kept.error


def test_a_binding_change_reaches_links_sharing_an_upstream_queue(tmp_path: Path) -> None:
    asyncio.run(_bindings_change_while_sharing(tmp_path))
