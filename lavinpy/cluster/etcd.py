"""An etcd v3 client over its JSON gateway (aiohttp; no grpc).

The gateway's conventions: keys and values are base64, int64s are strings, an expired lease answers
keepalive with 200 and no TTL, a failed txn has no "succeeded", and a watch is a POST whose answer
streams one JSON object per line. Several endpoints may be given: a connection error moves on to the
next one.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp

log = logging.getLogger("lavinpy.cluster.etcd")

REQUEST_TIMEOUT = 2.0


class EtcdError(Exception):
    """etcd answered with an error, or no endpoint could be reached."""


class EtcdUnavailable(EtcdError):
    """No endpoint answered."""


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int

    @property
    def text(self) -> str:
        return self.value.decode()


@dataclass(frozen=True)
class WatchEvent:
    kind: str  # "PUT" or "DELETE"
    kv: KeyValue


@dataclass(frozen=True)
class Compare:
    """One txn condition: ``target`` is CREATE, MOD, VALUE or LEASE (compared for equality)."""

    key: str
    target: str
    value: int | str | bytes

    def encode(self) -> dict[str, Any]:
        field = {"CREATE": "create_revision", "MOD": "mod_revision", "VALUE": "value", "LEASE": "lease"}[self.target]
        value = self.value
        if self.target == "VALUE":
            value = _b64(value if isinstance(value, bytes) else str(value).encode())
        else:
            value = str(value)
        return {"key": _b64(self.key), "target": self.target, "result": "EQUAL", field: value}


def _b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def prefix_end(prefix: str) -> str:
    """The range_end covering every key that starts with ``prefix``."""
    raw = bytearray(prefix.encode())
    while raw and raw[-1] == 0xFF:
        raw.pop()
    raw[-1] += 1
    return raw.decode("latin-1")


def _kv(item: dict[str, Any]) -> KeyValue:
    return KeyValue(key=_unb64(item.get("key")).decode(), value=_unb64(item.get("value")),
                    create_revision=int(item.get("create_revision", 0)),
                    mod_revision=int(item.get("mod_revision", 0)), lease=int(item.get("lease", 0)))


def put_op(key: str, value: str | bytes, lease: int = 0) -> dict[str, Any]:
    """A put, for a txn's success or failure branch."""
    body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
    if lease:
        body["lease"] = str(lease)
    return {"request_put": body}


def delete_op(key: str) -> dict[str, Any]:
    """A delete of one key, for a txn's success or failure branch (no error when it is absent)."""
    return {"request_delete_range": {"key": _b64(key)}}


class EtcdClient:
    def __init__(self, endpoints: str | list[str], timeout: float = REQUEST_TIMEOUT) -> None:
        items = endpoints.split(",") if isinstance(endpoints, str) else endpoints
        self.endpoints = [e.strip() if "://" in e else f"http://{e.strip()}" for e in items if e.strip()]
        if not self.endpoints:
            raise ValueError("no etcd endpoint given")
        self._current = 0  # the endpoint that answered last
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to /v3/``path`` on the first endpoint that answers."""
        errors = []
        for i in range(len(self.endpoints)):
            index = (self._current + i) % len(self.endpoints)
            url = f"{self.endpoints[index]}/v3/{path}"
            try:
                async with self._http().post(url, json=body, timeout=self._timeout) as response:
                    text = await response.text()
            except (TimeoutError, aiohttp.ClientError, OSError) as e:
                errors.append(f"{self.endpoints[index]}: {e!r}")
                continue
            self._current = index
            data = json.loads(text.splitlines()[0]) if text.strip() else {}
            if response.status != 200:
                raise EtcdError(f"etcd {path}: HTTP {response.status}: {data.get('message') or data.get('error')}")
            if "error" in data:  # a streamed call (keepalive) reports errors in the body
                raise EtcdError(f"etcd {path}: {data['error']}")
            return data
        raise EtcdUnavailable(f"no etcd endpoint answered: {'; '.join(errors)}")

    # --- leases ---------------------------------------------------------------------------------
    async def lease_grant(self, ttl: int) -> int:
        data = await self.call("lease/grant", {"TTL": str(ttl)})
        return int(data["ID"])

    async def lease_keepalive(self, lease: int) -> int:
        """The lease's remaining TTL in seconds; 0 when the lease is gone (expired or revoked)."""
        data = await self.call("lease/keepalive", {"ID": str(lease)})
        return int(data.get("result", {}).get("TTL", 0))

    async def lease_time_to_live(self, lease: int) -> int:
        """The lease's remaining TTL in whole seconds as etcd counts it; -1 when it is gone."""
        data = await self.call("lease/timetolive", {"ID": str(lease)})
        return int(data.get("TTL", -1))

    async def lease_revoke(self, lease: int) -> bool:
        """Revoke a lease (its keys go with it); False when it was already gone."""
        try:
            await self.call("lease/revoke", {"ID": str(lease)})
        except EtcdUnavailable:
            raise
        except EtcdError as e:
            if "not found" in str(e):
                return False
            raise
        return True

    # --- keys -----------------------------------------------------------------------------------
    async def get(self, key: str) -> KeyValue | None:
        data = await self.call("kv/range", {"key": _b64(key)})
        kvs = data.get("kvs") or []
        return _kv(kvs[0]) if kvs else None

    async def get_prefix(self, prefix: str) -> list[KeyValue]:
        data = await self.call("kv/range", {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))})
        return [_kv(item) for item in data.get("kvs") or []]

    async def put(self, key: str, value: str | bytes, lease: int = 0) -> None:
        await self.call("kv/put", put_op(key, value, lease)["request_put"])

    async def delete(self, key: str, prefix: bool = False) -> int:
        body = {"key": _b64(key)}
        if prefix:
            body["range_end"] = _b64(prefix_end(key))
        data = await self.call("kv/deleterange", body)
        return int(data.get("deleted", 0))

    async def txn(self, compare: list[Compare], success: list[dict[str, Any]],
                  failure: list[dict[str, Any]] | None = None) -> bool:
        """Run ``success`` if every comparison holds, else ``failure``; whether it succeeded."""
        data = await self.call("kv/txn", {"compare": [c.encode() for c in compare], "success": success,
                                          "failure": failure or []})
        return bool(data.get("succeeded", False))

    async def put_if_absent(self, key: str, value: str | bytes, lease: int = 0) -> bool:
        return await self.txn([Compare(key, "CREATE", 0)], [put_op(key, value, lease)])

    # --- watch ----------------------------------------------------------------------------------
    async def watch(self, key: str, prefix: bool = False, start_revision: int = 0) -> AsyncIterator[WatchEvent]:
        """Events on ``key`` (or every key under it) until the stream ends; raises EtcdError on errors."""
        request: dict[str, Any] = {"key": _b64(key)}
        if prefix:
            request["range_end"] = _b64(prefix_end(key))
        if start_revision:
            request["start_revision"] = str(start_revision)
        url = f"{self.endpoints[self._current]}/v3/watch"
        try:
            async with self._http().post(url, json={"create_request": request},
                                         timeout=aiohttp.ClientTimeout(total=None, sock_connect=REQUEST_TIMEOUT)
                                         ) as response:
                if response.status != 200:
                    raise EtcdError(f"etcd watch: HTTP {response.status}")
                async for line in response.content:
                    if not line.strip():
                        continue
                    result = json.loads(line).get("result", {})
                    if result.get("canceled"):
                        raise EtcdError(f"etcd watch canceled: {result.get('cancel_reason', '')}")
                    for event in result.get("events") or []:
                        yield WatchEvent(event.get("type", "PUT"), _kv(event.get("kv", {})))
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            raise EtcdUnavailable(f"etcd watch: {e!r}")
