"""Two federation links sharing one upstream queue, in process: one lavinpy server is both sides (the
upstream exchange up.x, the federated exchange down.x bound to down.q), the links made directly."""

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


async def until(check: Any, what: str, timeout: float = 15.0) -> None:
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
async def shared_site(workdir: Path, upstream_names: tuple[str, ...], start: bool = True,
                      **keys: Any) -> AsyncIterator[Site]:
    """A lavinpy server, upstream exchange up.x federated into down.x (bound to down.q) by one link per
    name, every link on the same upstream URI and exchange (and upstream ``keys``): they share the upstream
    queue. ``start``: the links started and running (else left for the caller to start)."""
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
        if start:
            for link in links:
                link.start()
            await until(lambda: all(link.state == "running" for link in links), "every link running")
        yield Site(server, client, upstream_x, down_q, links)
    finally:
        for link in links:
            await link.stop()
        await client.close()
        await server.stop()
