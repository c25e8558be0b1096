"""Removing one of two links that share an upstream queue (test_shared_upstream_queue.py says how they come
to share it): its cleanup must leave the queue and the internal exchange the other link still consumes and
binds through, so that every message confirmed upstream meanwhile arrives downstream and the other link keeps
running. The last link's removal deletes them, as RabbitMQ's cleanup does; a queue another broker's link
still consumes (an upstream consumer this node does not know) is left too.

In process, one lavinpy server being both sides, confirmed messages are published upstream all along."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aio_pika

from tests.federation.shared_site import shared_site, until


async def _remove_one_of_two(workdir: Path) -> None:
    async with shared_site(workdir, ("one", "two")) as site:
        removed, kept = site.links
        queue = kept.status("n", "id")["queue"]
        assert removed.status("n", "id")["queue"] == queue  # the two links share the upstream queue
        stop = asyncio.Event()
        publishing = asyncio.create_task(site.publish_all_along(stop))
        await until(lambda: len(site.confirmed) > 20, "messages published before the removal")
        await removed.stop(cleanup=True)  # its upstream parameter deleted, or the policy's set changed
        before = len(site.confirmed)
        await until(lambda: len(site.confirmed) > before + 100, "messages published after the removal")
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
    async with shared_site(workdir, ("one", "two")) as site:
        queue = site.links[0].status("n", "id")["queue"]
        assert site.upstream_objects(queue)
        # The policy deleted: both links are removed together, and whichever leaves last deletes.
        await asyncio.gather(*(link.stop(cleanup=True) for link in site.links))
        assert site.upstream_objects(queue) == set()


def test_removing_both_links_on_one_upstream_queue_deletes_it(tmp_path: Path) -> None:
    asyncio.run(_remove_both_at_once(tmp_path))


async def _remove_while_another_broker_consumes(workdir: Path) -> None:
    # The queue named by the upstream's "queue" key: the client here cannot name the default one.
    async with shared_site(workdir, ("one",), queue="fed.shared") as site:
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
        await until(lambda: len(site.confirmed) > 20, "messages published before the removal")
        await link.stop(cleanup=True)
        before = len(site.confirmed)
        await until(lambda: len(site.confirmed) > before + 100, "messages published after the removal")
        assert site.upstream_objects(queue) == {queue, f"{queue} {link.suffix}"}  # still consumed, still bound
        stop.set()
        await publishing
        assert not await site.drain(also=theirs), "confirmed upstream, reached neither consumer"
        assert set(theirs) & set(range(before, len(site.confirmed))), "the other broker's link got nothing after"


def test_removing_a_link_leaves_a_queue_another_broker_consumes(tmp_path: Path) -> None:
    asyncio.run(_remove_while_another_broker_consumes(tmp_path))


async def _bindings_change_while_sharing(workdir: Path) -> None:
    async with shared_site(workdir, ("one", "two")) as site:
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
