"""Two links of one federated exchange whose upstreams name the same upstream exchange of the same broker
(an upstream set "all" over two upstream parameters: tests/federation/test_federation_faults.py's module
makes this, its second test's exchange federated from both tests' upstreams) share the upstream queue and
its internal exchanges A and B. Their starts must not delete the exchange the other's start just bound
while nothing else carries the bindings: what is published upstream then is routed nowhere, confirmed.

In process, one lavinpy server being both sides, the two starts are run into the interleaving that
dropped confirmed messages: the first start pauses after looking at which suffix is free while the second
start runs; each deletion of an internal exchange by either is followed by a confirmed publish upstream,
and every such message must reach the downstream queue."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aio_pika

from lavinpy import config as lavinpy_config
from lavinpy.federation.link import ExchangeLink, LinkEnv
from lavinpy.federation.turns import START_TURNS
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


async def _two_links_start_at_once(workdir: Path) -> tuple[list[int], list[int], list[str]]:
    """(confirmed numbers published upstream right after each internal exchange deletion, the numbers the
    downstream queue got, the deletions in order as "link: exchange")."""
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
                                                                    "reconnect-delay": 0.2}), env)
                 for name in ("one", "two")]
        first, second = links
        confirmed: list[int] = []
        deletions: list[str] = []
        carried = False  # a start has ended: an internal exchange carries the bindings from now on

        def deleting(link: ExchangeLink) -> Any:
            delete = link._delete_exchange

            async def deleted_then_publish(up: Any, name: str) -> None:
                nonlocal carried
                await delete(up, name)
                deletions.append(f"{link.upstream.name}: {name[-1]}")
                carried = carried or name != link._internal  # the old one's deletion ends a start
                if carried:  # routed through whichever internal exchange is bound now, if any
                    await upstream_x.publish(aio_pika.Message(str(len(confirmed)).encode()), routing_key="")
                    confirmed.append(len(confirmed))
            return deleted_then_publish

        for link in links:
            link._delete_exchange = deleting(link)  # type: ignore[method-assign]
        declare = first._declare_internal
        turn_key: list[Any] = []

        async def paused_declare(up: Any, name: str) -> None:
            # The first start has chosen its suffix; the second start runs now, to its end unless it has
            # to wait for this one's (two starts hold or wait for the queue's turn).
            turn_key.append(first.turn_key(name.rsplit(" ", 1)[0]))
            await _until(lambda: second.state == "running" or START_TURNS.wanting(turn_key[0]) == 2,
                         "the second start to run or to wait")
            first._declare_internal = declare  # type: ignore[method-assign]
            await declare(up, name)

        first._declare_internal = paused_declare  # type: ignore[method-assign]
        first.start()
        await _until(lambda: bool(turn_key), "the first start to choose its suffix")
        second.start()
        await _until(lambda: first.state == "running" and second.state == "running", "both links")
        for _ in range(5):  # and through both running links
            await upstream_x.publish(aio_pika.Message(str(len(confirmed)).encode()), routing_key="")
            confirmed.append(len(confirmed))
        got: list[int] = []

        async def drained() -> bool:
            while (message := await down_q.get(no_ack=True, fail=False)) is not None:
                got.append(int(message.body))
            return set(got) >= set(confirmed)
        deadline = time.monotonic() + 10
        while not await drained() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return confirmed, got, deletions
    finally:
        for link in links:
            await link.stop()
        await client.close()
        await server.stop()


def test_two_links_on_one_upstream_queue_lose_nothing_when_they_start_together(tmp_path: Path) -> None:
    confirmed, got, deletions = asyncio.run(_two_links_start_at_once(tmp_path))
    assert len(confirmed) > 5, deletions  # published after deletions, not only once both ran
    missing = sorted(set(confirmed) - set(got))
    assert not missing, f"confirmed upstream, routed nowhere: {missing}; deletions {deletions}"
