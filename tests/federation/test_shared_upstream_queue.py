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
from pathlib import Path
from typing import Any

import aio_pika

from lavinpy.federation.link import ExchangeLink
from lavinpy.federation.turns import START_TURNS
from tests.federation.shared_site import shared_site, until


async def _two_links_start_at_once(workdir: Path) -> tuple[list[int], list[int], list[str]]:
    """(confirmed numbers published upstream right after each internal exchange deletion, the numbers the
    downstream queue got, the deletions in order as "link: exchange")."""
    async with shared_site(workdir, ("one", "two"), start=False) as site:
        first, second = site.links
        confirmed = site.confirmed
        deletions: list[str] = []
        carried = False  # a start has ended: an internal exchange carries the bindings from now on

        async def publish() -> None:
            await site.upstream_x.publish(aio_pika.Message(str(len(confirmed)).encode()), routing_key="")
            confirmed.append(len(confirmed))

        def deleting(link: ExchangeLink) -> Any:
            delete = link._delete_exchange

            async def deleted_then_publish(up: Any, name: str) -> None:
                nonlocal carried
                await delete(up, name)
                deletions.append(f"{link.upstream.name}: {name[-1]}")
                carried = carried or name != link._internal  # the old one's deletion ends a start
                if carried:  # routed through whichever internal exchange is bound now, if any
                    await publish()
            return deleted_then_publish

        for link in site.links:
            link._delete_exchange = deleting(link)  # type: ignore[method-assign]
        declare = first._declare_internal
        turn_key: list[Any] = []

        async def paused_declare(up: Any, name: str) -> None:
            # The first start has chosen its suffix; the second start runs now, to its end unless it has
            # to wait for this one's (two starts hold or wait for the queue's turn).
            turn_key.append(first.turn_key(name.rsplit(" ", 1)[0]))
            await until(lambda: second.state == "running" or START_TURNS.wanting(turn_key[0]) == 2,
                        "the second start to run or to wait")
            first._declare_internal = declare  # type: ignore[method-assign]
            await declare(up, name)

        first._declare_internal = paused_declare  # type: ignore[method-assign]
        first.start()
        await until(lambda: bool(turn_key), "the first start to choose its suffix")
        second.start()
        await until(lambda: first.state == "running" and second.state == "running", "both links")
        for _ in range(5):  # and through both running links
            await publish()
        await site.drain()
        return confirmed, site.got, deletions


def test_two_links_on_one_upstream_queue_lose_nothing_when_they_start_together(tmp_path: Path) -> None:
    confirmed, got, deletions = asyncio.run(_two_links_start_at_once(tmp_path))
    assert len(confirmed) > 5, deletions  # published after deletions, not only once both ran
    missing = sorted(set(confirmed) - set(got))
    assert not missing, f"confirmed upstream, routed nowhere: {missing}; deletions {deletions}"
