"""An etcd v3 client over its JSON gateway (aiohttp; no grpc).

The gateway's conventions: keys and values are base64, int64s are strings, an expired lease answers
keepalive with 200 and no TTL, a failed txn has no "succeeded", and a watch is a POST whose answer
streams one JSON object per line.

Every request has its own timeout, and a call tries the endpoints in turn, starting with the one
that answered last. It moves on when a member cannot serve (no connection, no answer in time, HTTP
5xx, or an error such as "etcdserver: no leader"), never on the caller's own errors (a 4xx, a lease
not found); a failed txn compare is an answer, not an error. One call takes at most
``request_timeout`` per endpoint, and never runs past the ``deadline`` (loop time) a caller passes.

Reads stay linearizable: a member cut off from the majority must not answer with what it last knew.
Every request carries the gRPC metadata ``hasleader``, so such a member refuses at once with "no
leader" (and the call moves on) instead of holding the request for etcd's own 5-7 s.

A request whose answer was lost (timeout, 5xx) may still be applied by etcd. Trying it again
elsewhere is safe for this client's writes (a put repeats itself, a fenced txn re-checks its fence),
but a create-if-absent txn retried that way finds the key it created itself: ``put_if_absent``
recognises that case; callers of ``txn`` that create keys should read back when it says False.

With a user name the client authenticates (``auth/authenticate``) before its first request and sends
the token etcd gives in the ``Authorization`` header; a token etcd no longer takes (expired, revoked
by a password change, issued before a change of roles, or lost with a restarted member) is replaced
once and the request sent again. With a TLS context the endpoints are ``https://`` (unless they say
otherwise) and the context verifies etcd's certificate and presents the client's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp

from .etcd_codec import (
    _HEADERS,
    Compare,
    EtcdAuthFailed,
    EtcdCompacted,
    EtcdError,
    EtcdUnavailable,
    KeyValue,
    WatchEvent,
    _b64,
    _describe,
    _error_of,
    _kv,
    _loop_time,
    _member_cannot_serve,
    _parse,
    _token_rejected,
    delete_op,
    prefix_end,
    put_op,
    range_op,
)

__all__ = ["Compare", "EtcdAuthFailed", "EtcdClient", "EtcdCompacted", "EtcdError", "EtcdUnavailable", "KeyValue",
           "Watch", "WatchEvent", "delete_op", "prefix_end", "put_op", "range_op"]

log = logging.getLogger("lavinpy.cluster.etcd")

REQUEST_TIMEOUT = 1.0  # connect + answer, per endpoint
KEEPALIVE_TIMEOUT = 0.5  # a lease keepalive is answered from the leader's memory: fast or not at all
WATCH_IDLE_TIMEOUT = 5.0  # a watch that hears nothing for this long ends, to be resumed elsewhere


class _TokenRejected(EtcdError):
    """etcd no longer takes the client's token: authenticate again."""

    def __init__(self, message: str, uncertain: bool) -> None:
        super().__init__(message)
        self.uncertain = uncertain


class EtcdClient:
    def __init__(self, endpoints: str | list[str], request_timeout: float = REQUEST_TIMEOUT,
                 watch_idle_timeout: float = WATCH_IDLE_TIMEOUT, keepalive_timeout: float = KEEPALIVE_TIMEOUT,
                 user: str = "", password: str = "", tls: ssl.SSLContext | None = None) -> None:
        items = endpoints.split(",") if isinstance(endpoints, str) else endpoints
        scheme = "https" if tls is not None else "http"
        self.endpoints = [e.strip() if "://" in e else f"{scheme}://{e.strip()}" for e in items if e.strip()]
        if not self.endpoints:
            raise ValueError("no etcd endpoint given")
        self.request_timeout = request_timeout
        self.watch_idle_timeout = watch_idle_timeout
        self.keepalive_timeout = keepalive_timeout
        self.user = user
        self._password = password
        self._tls = tls
        self._token = ""  # etcd's token for ``user``; "" until authenticated
        self._authenticating: asyncio.Lock | None = None
        self._current = 0  # the endpoint that answered last: tried first
        self._session: aiohttp.ClientSession | None = None

    @property
    def current_endpoint(self) -> str:
        """The endpoint the next call tries first."""
        return self.endpoints[self._current]

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self._tls) if self._tls is not None else None
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    def _headers(self) -> dict[str, str]:
        return {**_HEADERS, "Authorization": self._token} if self._token else _HEADERS

    async def _authenticate(self, stale: str, deadline: float | None) -> None:
        """A new token, unless another call replaced ``stale`` meanwhile. EtcdAuthFailed when etcd
        refuses the user name or password."""
        if self._authenticating is None:
            self._authenticating = asyncio.Lock()
        async with self._authenticating:
            if self._token != stale:
                return
            self._token = ""
            body = {"name": self.user, "password": self._password}
            try:
                data, _ = await self._call_once("auth/authenticate", body, deadline, None)
            except EtcdUnavailable:
                raise
            except EtcdError as e:
                raise EtcdAuthFailed(f"etcd refused user {self.user!r}: {str(e).split(': ', 2)[-1]} (check "
                                     "clustering_etcd_user and clustering_etcd_password)") from None
            self._token = str(data.get("token", ""))
            if not self._token:
                raise EtcdAuthFailed(f"etcd gave user {self.user!r} no token: is authentication enabled?")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _answered(self, index: int) -> None:
        if index != self._current:
            log.info("etcd: now using %s (was %s)", self.endpoints[index], self.endpoints[self._current])
            self._current = index

    def _attempts(self, timeout: float, deadline: float | None) -> Iterator[tuple[int, float]]:
        """(endpoint index, time budget) for each try of one call: every endpoint once, the one that
        answered last first, each at most ``timeout``, all of them before ``deadline``."""
        count = len(self.endpoints)
        end = _loop_time() + timeout * count
        if deadline is not None:
            end = min(end, deadline)
        first = self._current
        for i in range(count):
            budget = min(timeout, end - _loop_time())  # evaluated as each try starts
            if budget <= 0:
                return
            yield (first + i) % count, budget

    async def call(self, path: str, body: dict[str, Any], deadline: float | None = None,
                   timeout: float | None = None) -> dict[str, Any]:
        """POST ``body`` to /v3/``path`` on the first endpoint that can serve it."""
        data, _ = await self._call(path, body, deadline, timeout)
        return data

    async def _call(self, path: str, body: dict[str, Any], deadline: float | None,
                    timeout: float | None) -> tuple[dict[str, Any], bool]:
        """The answer, and whether an earlier try's request may have been applied without an answer."""
        if not self.user:
            return await self._call_once(path, body, deadline, timeout)
        token = self._token
        if not token:
            await self._authenticate(token, deadline)
            token = self._token
        try:
            return await self._call_once(path, body, deadline, timeout)
        except _TokenRejected as e:
            log.info("etcd: the token of user %r was refused (%s); authenticating again", self.user, e)
            await self._authenticate(token, deadline)
            data, uncertain = await self._call_once(path, body, deadline, timeout)
            return data, uncertain or e.uncertain

    async def _call_once(self, path: str, body: dict[str, Any], deadline: float | None,
                         timeout: float | None) -> tuple[dict[str, Any], bool]:
        errors: list[str] = []
        uncertain = False
        for index, budget in self._attempts(timeout or self.request_timeout, deadline):
            endpoint = self.endpoints[index]
            try:
                async with self._http().post(f"{endpoint}/v3/{path}", json=body, headers=self._headers(),
                                             timeout=aiohttp.ClientTimeout(total=budget)) as response:
                    status = response.status
                    text = await response.text()
            except aiohttp.ClientConnectorError as e:  # never connected: the request did not reach etcd
                errors.append(f"{endpoint}: {e!r}")
                continue
            except (TimeoutError, aiohttp.ClientError, OSError) as e:
                errors.append(f"{endpoint}: {_describe(e, budget)}")
                uncertain = True
                continue
            data = _parse(text)
            if data is None:
                if status == 200 or status >= 500:
                    errors.append(f"{endpoint}: HTTP {status}, not an etcd answer: {text[:80]!r}")
                    continue
                self._answered(index)
                raise EtcdError(f"etcd {path}: HTTP {status}: {text.strip()[:200]}")
            error = _error_of(data)
            if _member_cannot_serve(status, error):
                errors.append(f"{endpoint}: HTTP {status}: {error[1] if error else text.strip()[:80]}")
                # A refusal for want of a leader happens before etcd looks at the request.
                uncertain = uncertain or error is None or "no leader" not in error[1]
                continue
            self._answered(index)
            if error is not None and _token_rejected(error[1]):
                if self.user:
                    raise _TokenRejected(error[1], uncertain)
                raise EtcdAuthFailed(f"etcd {path}: {error[1]}: etcd requires authentication (set "
                                     "clustering_etcd_user and clustering_etcd_password)")
            if error is not None or status != 200:
                raise EtcdError(f"etcd {path}: HTTP {status}: {error[1] if error else text.strip()[:200]}")
            return data, uncertain
        raise EtcdUnavailable(f"etcd {path}: no endpoint could serve: {'; '.join(errors) or 'deadline passed'}")

    # --- leases ---------------------------------------------------------------------------------
    async def lease_grant(self, ttl: int, deadline: float | None = None) -> int:
        data = await self.call("lease/grant", {"TTL": str(ttl)}, deadline)
        return int(data["ID"])

    async def lease_keepalive(self, lease: int, deadline: float | None = None) -> int:
        """The lease's remaining TTL in seconds; 0 when the lease is gone (expired or revoked).
        Each endpoint gets ``keepalive_timeout``: a healthy leader answers in milliseconds, and the
        node's lease deadline counts from before the call."""
        data = await self.call("lease/keepalive", {"ID": str(lease)}, deadline, self.keepalive_timeout)
        return int(data.get("result", {}).get("TTL", 0))

    async def lease_time_to_live(self, lease: int, deadline: float | None = None) -> int:
        """The lease's remaining TTL in whole seconds as etcd counts it; -1 when it is gone."""
        data = await self.call("lease/timetolive", {"ID": str(lease)}, deadline)
        return int(data.get("TTL", -1))

    async def lease_revoke(self, lease: int, deadline: float | None = None) -> bool:
        """Revoke a lease (its keys go with it); False when it was already gone."""
        try:
            await self.call("lease/revoke", {"ID": str(lease)}, deadline)
        except EtcdUnavailable:
            raise
        except EtcdError as e:
            if "not found" in str(e):
                return False
            raise
        return True

    # --- keys -----------------------------------------------------------------------------------
    async def get(self, key: str, deadline: float | None = None) -> KeyValue | None:
        data = await self.call("kv/range", {"key": _b64(key)}, deadline)
        kvs = data.get("kvs") or []
        return _kv(kvs[0]) if kvs else None

    async def get_prefix(self, prefix: str, deadline: float | None = None) -> list[KeyValue]:
        data = await self.call("kv/range", {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))}, deadline)
        return [_kv(item) for item in data.get("kvs") or []]

    async def revision(self, deadline: float | None = None) -> int:
        """etcd's current revision (a linearizable read): watch from it + 1 to see every later change."""
        data = await self.call("kv/range", {"key": _b64("\0"), "count_only": True}, deadline)
        return int(data.get("header", {}).get("revision", 0))

    async def put(self, key: str, value: str | bytes, lease: int = 0, deadline: float | None = None) -> None:
        await self.call("kv/put", put_op(key, value, lease)["request_put"], deadline)

    async def delete(self, key: str, prefix: bool = False, deadline: float | None = None) -> int:
        body = {"key": _b64(key)}
        if prefix:
            body["range_end"] = _b64(prefix_end(key))
        data = await self.call("kv/deleterange", body, deadline)
        return int(data.get("deleted", 0))

    async def txn(self, compare: list[Compare], success: list[dict[str, Any]],
                  failure: list[dict[str, Any]] | None = None, deadline: float | None = None) -> bool:
        """Run ``success`` if every comparison holds, else ``failure``; whether it succeeded."""
        data = await self.call("kv/txn", {"compare": [c.encode() for c in compare], "success": success,
                                          "failure": failure or []}, deadline)
        return bool(data.get("succeeded", False))

    async def put_if_absent(self, key: str, value: str | bytes, lease: int = 0, deadline: float | None = None) -> bool:
        """Create ``key``; False when it exists. A try whose answer was lost may have created it: then
        the key holding exactly this value and lease counts as created by this call."""
        body = {"compare": [Compare(key, "CREATE", 0).encode()], "success": [put_op(key, value, lease)],
                "failure": [range_op(key)]}
        data, uncertain = await self._call("kv/txn", body, deadline, None)
        if data.get("succeeded", False):
            return True
        if not uncertain:
            return False
        kvs = (data.get("responses") or [{}])[0].get("response_range", {}).get("kvs") or []
        raw = value.encode() if isinstance(value, str) else value
        return bool(kvs) and _kv(kvs[0]).value == raw and _kv(kvs[0]).lease == lease

    # --- watch ----------------------------------------------------------------------------------
    def watch(self, key: str, prefix: bool = False, start_revision: int = 0, deadline: float | None = None,
              idle_timeout: float | None = None) -> Watch:
        """Events on ``key`` (or every key under it), from ``start_revision`` (0: from now on), as an
        async iterator that ends with EtcdError; ``resume()`` continues where it stopped."""
        return Watch(self, key, prefix, start_revision, idle_timeout or self.watch_idle_timeout, deadline)


class Watch:
    """One watch stream, an async iterator of WatchEvent.

    It ends with EtcdError when the stream breaks, when its member loses its leader (etcd cancels the
    stream), or when nothing at all arrives for ``idle_timeout`` (a paused or cut-off member sends
    nothing, not even an error). To hear from a healthy member it asks for a progress report every
    third of ``idle_timeout``; etcd 3.4 sends the ones ``progress_notify`` asks for only every 10
    minutes by default. ``next_revision`` is where a new watch starts to miss nothing and repeat
    nothing: ``resume()`` makes that watch.
    """

    def __init__(self, client: EtcdClient, key: str, prefix: bool, start_revision: int, idle_timeout: float,
                 deadline: float | None) -> None:
        self.client = client
        self.key = key
        self.prefix = prefix
        self.start_revision = start_revision
        self.idle_timeout = idle_timeout
        self.deadline = deadline
        self.next_revision = start_revision  # 0 until the stream is created
        self.endpoint = ""
        self._events: AsyncIterator[WatchEvent] | None = None

    def resume(self, deadline: float | None = None) -> Watch:
        """A new watch of the same keys from where this one stopped (tried on every endpoint again)."""
        return Watch(self.client, self.key, self.prefix, self.next_revision, self.idle_timeout, deadline)

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        if self._events is None:
            self._events = self._run()
        return self._events

    async def aclose(self) -> None:
        if self._events is not None:
            await self._events.aclose()  # type: ignore[attr-defined]

    def _create_request(self) -> dict[str, Any]:
        request: dict[str, Any] = {"key": _b64(self.key), "progress_notify": True}
        if self.prefix:
            request["range_end"] = _b64(prefix_end(self.key))
        if self.next_revision:
            request["start_revision"] = str(self.next_revision)
        return request

    async def _requests(self, create: dict[str, Any]) -> AsyncIterator[bytes]:
        """The request stream: the create request, then progress requests while the watch lasts."""
        yield (json.dumps({"create_request": create}) + "\n").encode()
        while True:
            await asyncio.sleep(self.idle_timeout / 3)
            yield b'{"progress_request": {}}\n'

    async def _open(self) -> tuple[aiohttp.ClientResponse, dict[str, Any]]:
        """The stream and its "created" answer, from the first endpoint that can serve (with a new
        token once when etcd refuses the client's)."""
        client = self.client
        if client.user and not client._token:
            await client._authenticate("", self.deadline)
        token = client._token
        try:
            return await self._open_once()
        except _TokenRejected:
            await client._authenticate(token, self.deadline)
            return await self._open_once()

    async def _open_once(self) -> tuple[aiohttp.ClientResponse, dict[str, Any]]:
        client = self.client
        errors: list[str] = []
        for index, budget in client._attempts(client.request_timeout, self.deadline):
            endpoint = client.endpoints[index]
            response = None
            try:
                async with asyncio.timeout(budget):
                    # Without "Expect: 100-continue", Go's HTTP/1.1 server drains the request body
                    # before it sends the answer's headers: an open request stream would get none.
                    response = await client._http().post(
                        f"{endpoint}/v3/watch", data=self._requests(self._create_request()), headers=client._headers(),
                        timeout=aiohttp.ClientTimeout(total=None), expect100=True)
                    line = await response.content.readline()
            except (TimeoutError, aiohttp.ClientError, OSError) as e:
                if response is not None:
                    response.close()
                errors.append(f"{endpoint}: {_describe(e, budget)}")
                continue
            data = _parse(line.decode(errors="replace")) or {"error": f"not an etcd answer: {line[:80]!r}"}
            error = _error_of(data)
            if error is None and response.status == 200 and data.get("result", {}).get("created"):
                client._answered(index)
                self.endpoint = endpoint
                return response, data["result"]
            response.close()
            if _member_cannot_serve(response.status, error) or error is None:
                errors.append(f"{endpoint}: HTTP {response.status}: {error[1] if error else line[:80]!r}")
                continue
            client._answered(index)
            if client.user and _token_rejected(error[1]):
                raise _TokenRejected(error[1], False)
            raise EtcdError(f"etcd watch: {error[1]}")
        raise EtcdUnavailable(f"etcd watch: no endpoint could serve: {'; '.join(errors) or 'deadline passed'}")

    async def _run(self) -> AsyncIterator[WatchEvent]:
        response, created = await self._open()
        try:
            self._check_canceled(created)
            if not self.next_revision:  # a watch "from now" starts right after the revision it reports
                self.next_revision = int(created.get("header", {}).get("revision", 0)) + 1
            while True:
                try:
                    async with asyncio.timeout(self.idle_timeout):
                        line = await response.content.readline()
                except TimeoutError:
                    raise EtcdUnavailable(f"etcd watch on {self.endpoint}: nothing heard for {self.idle_timeout} s")
                except (aiohttp.ClientError, OSError) as e:
                    raise EtcdUnavailable(f"etcd watch on {self.endpoint}: {e!r}")
                if not line:
                    raise EtcdUnavailable(f"etcd watch on {self.endpoint}: the stream ended")
                if not line.strip():
                    continue
                data = _parse(line.decode(errors="replace"))
                if data is None:
                    raise EtcdUnavailable(f"etcd watch on {self.endpoint}: not an etcd answer: {line[:80]!r}")
                error = _error_of(data)
                if error is not None:  # e.g. "no leader": this member lost the majority
                    raise EtcdUnavailable(f"etcd watch on {self.endpoint}: {error[1]}")
                result = data.get("result", {})
                self._check_canceled(result)
                events = result.get("events") or []
                if not events and str(result.get("watch_id", "0")) != "-1":
                    # A progress report for this watch, in order with its events: nothing is pending
                    # up to that revision. (Those answering a progress request, watch id -1, may
                    # overtake events in etcd 3.4, so they only show that the member is alive.)
                    revision = int(result.get("header", {}).get("revision", 0))
                    self.next_revision = max(self.next_revision, revision + 1)
                for i, event in enumerate(events):
                    kv = _kv(event.get("kv", {}))
                    last_of_revision = i + 1 == len(events) or \
                        int(events[i + 1].get("kv", {}).get("mod_revision", 0)) != kv.mod_revision
                    # A txn's events share a revision: resume past it only once all of them were seen.
                    self.next_revision = max(self.next_revision, kv.mod_revision + (1 if last_of_revision else 0))
                    yield WatchEvent(event.get("type", "PUT"), kv)
        finally:
            response.close()

    def _check_canceled(self, result: dict[str, Any]) -> None:
        if not result.get("canceled"):
            return
        compacted = int(result.get("compact_revision", 0))
        if compacted:
            raise EtcdCompacted(f"etcd watch: revision {self.next_revision} is compacted (history starts at "
                                f"{compacted})", compacted)
        raise EtcdError(f"etcd watch canceled: {result.get('cancel_reason', '')}")
