"""The etcd gateway client against a real etcd: leases, ranges, txns, watch, endpoint fail-over."""

from __future__ import annotations

import asyncio

import pytest

from lavinpy.cluster.etcd import Compare, EtcdClient, EtcdUnavailable, prefix_end, put_op
from tests.helpers import free_port

from .harness import Etcd


def run(coro):
    return asyncio.run(coro)


def test_prefix_end() -> None:
    assert prefix_end("a/") == "a0"
    assert prefix_end("lavinpy/nodes/") == "lavinpy/nodes0"


def test_put_get_prefix_delete(etcd: Etcd) -> None:
    async def scenario() -> None:
        client = EtcdClient(etcd.endpoint)
        try:
            await client.put("p/a", "1")
            await client.put("p/b", b"\x00\xff")
            await client.put("q", "other")
            assert (await client.get("p/a")).text == "1"
            assert (await client.get("p/b")).value == b"\x00\xff"
            assert await client.get("p/missing") is None
            assert [kv.key for kv in await client.get_prefix("p/")] == ["p/a", "p/b"]
            assert await client.delete("p/", prefix=True) == 2
            assert await client.get_prefix("p/") == []
            assert (await client.get("q")).text == "other"
        finally:
            await client.close()
    run(scenario())


def test_lease_expiry_and_revoke(etcd: Etcd) -> None:
    async def scenario() -> None:
        client = EtcdClient(etcd.endpoint)
        try:
            lease = await client.lease_grant(2)
            await client.put("leased", "x", lease)
            assert (await client.get("leased")).lease == lease
            assert await client.lease_keepalive(lease) > 0
            await asyncio.sleep(3.5)  # no keepalive: the lease expires and its key goes
            assert await client.lease_keepalive(lease) == 0
            assert await client.get("leased") is None
            other = await client.lease_grant(30)
            await client.put("leased2", "y", other)
            assert await client.lease_revoke(other) is True
            assert await client.get("leased2") is None
            assert await client.lease_keepalive(other) == 0
            assert await client.lease_revoke(other) is False
        finally:
            await client.close()
    run(scenario())


def test_txn_create_if_absent_and_fenced_put(etcd: Etcd) -> None:
    async def scenario() -> None:
        client = EtcdClient(etcd.endpoint)
        try:
            lease = await client.lease_grant(30)
            assert await client.put_if_absent("leader", "tcp://a:1", lease) is True
            assert await client.put_if_absent("leader", "tcp://b:1", lease) is False
            assert (await client.get("leader")).text == "tcp://a:1"
            fence = [Compare("leader", "VALUE", "tcp://a:1"), Compare("leader", "LEASE", lease)]
            assert await client.txn(fence, [put_op("isr", '["a"]')]) is True
            assert (await client.get("isr")).text == '["a"]'
            wrong = [Compare("leader", "VALUE", "tcp://b:1"), Compare("leader", "LEASE", lease)]
            assert await client.txn(wrong, [put_op("isr", '["b"]')]) is False
            await client.lease_revoke(lease)  # the fence fails once the lease is gone
            assert await client.txn(fence, [put_op("isr", '["a","c"]')]) is False
            assert (await client.get("isr")).text == '["a"]'
        finally:
            await client.close()
    run(scenario())


def test_watch_sees_put_and_delete(etcd: Etcd) -> None:
    async def scenario() -> None:
        client = EtcdClient(etcd.endpoint)
        events = []

        async def watcher() -> None:
            async for event in client.watch("w/", prefix=True):
                events.append((event.kind, event.kv.key, event.kv.value))
                if len(events) == 2:
                    return
        try:
            task = asyncio.create_task(watcher())
            await asyncio.sleep(0.5)
            writer = EtcdClient(etcd.endpoint)
            await writer.put("w/k", "v")
            await writer.delete("w/k")
            await writer.close()
            await asyncio.wait_for(task, 5)
            assert events == [("PUT", "w/k", b"v"), ("DELETE", "w/k", b"")]
        finally:
            await client.close()
    run(scenario())


def test_next_endpoint_on_connection_error(etcd: Etcd) -> None:
    async def scenario() -> None:
        dead = f"127.0.0.1:{free_port()}"
        client = EtcdClient(f"{dead},{etcd.endpoint}")
        try:
            await client.put("k", "v")
            assert (await client.get("k")).text == "v"
        finally:
            await client.close()
        nothing = EtcdClient(dead)
        try:
            with pytest.raises(EtcdUnavailable):
                await nothing.get("k")
        finally:
            await nothing.close()
    run(scenario())
