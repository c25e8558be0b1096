"""The etcd client under failing endpoints, with real etcd processes: black holes, members answering
errors, a member cut off from its majority, a paused member, watches that go silent or lose quorum."""

from __future__ import annotations

import asyncio
import inspect
import json
import signal
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from lavinpy.cluster.etcd import Compare, EtcdClient, EtcdError, EtcdUnavailable, WatchEvent, put_op

from .harness import Etcd, EtcdCluster, etcd_binary

pytestmark = pytest.mark.skipif(etcd_binary() is None, reason="the etcd binary is missing")


def run(coro):
    return asyncio.run(coro)


def now() -> float:
    return asyncio.get_running_loop().time()


class BlackHole:
    """A TCP server that accepts connections and never answers."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.accepted: list[socket.socket] = []
        self._open = True
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self._listener.getsockname()[1]}"

    def _accept(self) -> None:
        while self._open:
            try:
                self.accepted.append(self._listener.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return

    def close(self) -> None:
        self._open = False
        for sock in [self._listener, *self.accepted]:
            sock.close()


class Answering:
    """An HTTP server giving every request the same status and JSON body, counting them."""

    def __init__(self, status: int, body: dict) -> None:
        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.requests += 1
                payload = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class LosesAnswers:
    """A TCP relay to etcd that delivers requests and drops the answers: the request is applied, the
    client hears nothing."""

    def __init__(self, target: str) -> None:
        host, port = target.split(":")
        self.target = (host, int(port))
        self.forwarded = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self._listener.getsockname()[1]}"

    def _accept(self) -> None:
        while True:
            try:
                conn = self._listener.accept()[0]
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self._sockets += [conn, upstream]
            threading.Thread(target=self._forward, args=(conn, upstream), daemon=True).start()
            threading.Thread(target=self._drain, args=(upstream,), daemon=True).start()

    def _forward(self, conn: socket.socket, upstream: socket.socket) -> None:
        try:
            while data := conn.recv(65536):
                self.forwarded += len(data)
                upstream.sendall(data)
        except OSError:
            pass

    def _drain(self, upstream: socket.socket) -> None:
        try:
            while upstream.recv(65536):
                pass
        except OSError:
            pass

    def close(self) -> None:
        for sock in [self._listener, *self._sockets]:
            sock.close()


@pytest.fixture
def etcd3(tmp_path: Path) -> Iterator[EtcdCluster]:
    members = EtcdCluster(tmp_path / "etcd3")
    try:
        members.start()
        yield members
    finally:
        members.stop()


async def collect(watch, into: list[WatchEvent]) -> None:
    async for event in watch:
        into.append(event)


async def first_events(watch, count: int) -> list[WatchEvent]:
    events = []
    async for event in watch:
        events.append(event)
        if len(events) == count:
            break
    return events


async def eventually(check, timeout: float, what: str) -> None:
    """Poll ``check`` (plain or async) until it holds."""
    end = time.monotonic() + timeout
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return
        assert time.monotonic() < end, f"timed out after {timeout} s waiting for {what}"
        await asyncio.sleep(0.05)


# --- endpoints that do not answer, or answer errors -------------------------------------------------
def test_black_holed_endpoint_first_costs_one_timeout_then_is_skipped(etcd: Etcd) -> None:
    async def scenario() -> None:
        hole = BlackHole()
        client = EtcdClient([hole.endpoint, etcd.endpoint], request_timeout=0.5, keepalive_timeout=0.2)
        try:
            started = now()
            await client.put("k", "v")
            assert now() - started < 0.5 + 0.4
            assert len(hole.accepted) == 1
            assert client.current_endpoint.endswith(etcd.endpoint)
            started = now()
            assert (await client.get("k")).text == "v"
            assert now() - started < 0.25 and len(hole.accepted) == 1  # straight to the endpoint that answered

            # A new client starts at the black hole again: the keepalive gives it only its own timeout.
            lease = await client.lease_grant(10)
            fresh = EtcdClient([hole.endpoint, etcd.endpoint], request_timeout=2.0, keepalive_timeout=0.2)
            started = now()
            assert await fresh.lease_keepalive(lease) > 0
            assert now() - started < 0.2 + 0.3
            await fresh.close()

            # So does a watch: created on the next endpoint, it sees what follows.
            watcher = EtcdClient([hole.endpoint, etcd.endpoint], request_timeout=0.5)
            events: list[WatchEvent] = []
            started = now()
            task = asyncio.create_task(collect(watcher.watch("w"), events))
            await eventually(lambda: watcher.current_endpoint.endswith(etcd.endpoint), 2, "watch")
            await asyncio.sleep(0.1)
            await client.put("w", "1")
            await eventually(lambda: bool(events), 2, "the watch event")
            assert now() - started < 0.5 + 1.0 and events[0].kv.text == "1"
            task.cancel()
            await watcher.close()
        finally:
            await client.close()
            hole.close()
    run(scenario())


def test_a_call_is_bounded_by_its_endpoints_and_by_its_deadline(etcd: Etcd) -> None:
    async def scenario() -> None:
        holes = [BlackHole(), BlackHole()]
        client = EtcdClient([h.endpoint for h in holes], request_timeout=0.3)
        try:
            started = now()
            with pytest.raises(EtcdUnavailable, match="no answer within"):
                await client.get("k")
            assert 0.55 < now() - started < 0.6 + 0.3  # each endpoint once, each for its own timeout

            late = EtcdClient([holes[0].endpoint, holes[1].endpoint, etcd.endpoint], request_timeout=1.0)
            before = len(holes[1].accepted)
            started = now()
            with pytest.raises(EtcdUnavailable):
                await late.get("k", deadline=now() + 0.3)
            assert 0.25 < now() - started < 0.3 + 0.2
            assert len(holes[1].accepted) == before  # the deadline had passed: nothing else was tried
            await late.close()
        finally:
            await client.close()
            for hole in holes:
                hole.close()
    run(scenario())


def test_members_answering_they_cannot_serve_are_skipped(etcd: Etcd) -> None:
    async def scenario() -> None:
        refusing = [
            Answering(503, {"error": "etcdserver: no leader", "message": "etcdserver: no leader", "code": 14}),
            Answering(200, {"error": {"grpc_code": 14, "http_code": 503, "message": "etcdserver: no leader"}}),
            Answering(500, {"error": "context deadline exceeded", "message": "context deadline exceeded", "code": 2}),
            Answering(503, {"error": "etcdserver: request timed out", "message": "etcdserver: request timed out"}),
        ]
        client = EtcdClient([s.endpoint for s in refusing] + [etcd.endpoint], request_timeout=0.5)
        try:
            started = now()
            await client.put("k", "v")
            assert (await client.get("k")).text == "v"
            assert now() - started < 0.5
            assert [s.requests for s in refusing] == [1, 1, 1, 1]  # once each, then the one that answered
            assert client.current_endpoint.endswith(etcd.endpoint)
        finally:
            await client.close()
            for server in refusing:
                server.close()
    run(scenario())


def test_the_callers_errors_are_not_retried_elsewhere(etcd: Etcd) -> None:
    async def scenario() -> None:
        spare = Answering(200, {"kvs": []})  # would answer anything: it must never be asked
        client = EtcdClient([etcd.endpoint, spare.endpoint], request_timeout=0.5)
        try:
            with pytest.raises(EtcdError, match="lease not found") as raised:
                await client.put("k", "v", lease=12345)
            assert not isinstance(raised.value, EtcdUnavailable)
            assert await client.lease_revoke(12345) is False
            assert await client.txn([Compare("absent", "VALUE", "x")], [put_op("absent", "y")]) is False
            with pytest.raises(EtcdError, match="HTTP 4"):
                await client.call("kv/range", {"key": ""})  # etcd: key is not provided
            assert spare.requests == 0
        finally:
            await client.close()
            spare.close()
    run(scenario())


def test_put_if_absent_recognises_its_own_write_when_the_answer_was_lost(etcd: Etcd) -> None:
    async def scenario() -> None:
        lossy = LosesAnswers(etcd.endpoint)
        client = EtcdClient([lossy.endpoint, etcd.endpoint], request_timeout=0.5)
        try:
            lease = await EtcdClient(etcd.endpoint).lease_grant(30)
            assert await client.put_if_absent("leader", "me", lease) is True
            assert lossy.forwarded > 0  # the first try reached etcd and created the key
            current = await client.get("leader")
            assert (current.text, current.lease) == ("me", lease)
            assert await client.put_if_absent("leader", "someone else", lease) is False
        finally:
            await client.close()
            lossy.close()
    run(scenario())


# --- a member cut off from the others ---------------------------------------------------------------
def test_a_minority_member_listed_first_is_not_read_from(etcd3: EtcdCluster) -> None:
    async def scenario() -> None:
        minority = etcd3.members[0]
        client = EtcdClient(etcd3.endpoints, request_timeout=0.5)
        alone = EtcdClient([minority.endpoint], request_timeout=0.5)
        try:
            await client.put("x", "old")
            etcd3.isolate(minority)
            others = EtcdClient(etcd3.endpoints[1:], request_timeout=0.5)
            await eventually(lambda: _written(others, "x", "new"), 10, "a write by the majority")
            await others.close()
            # Read at once: the cut-off member may not know yet that it has no leader, and answers
            # only what is certain (a linearizable read), so the client reads from the majority.
            started = now()
            assert (await client.get("x")).text == "new"
            assert now() - started < 0.5 + 0.3
            await eventually(lambda: _refuses(alone, "no leader"), 10, "the cut-off member to lose its leader")
            stale = minority.call("kv/range", {"key": "eA==", "serializable": True})["kvs"][0]["value"]
            assert stale == "b2xk"  # "old": the cut-off member still holds it
            client._current = 0  # as a client that starts with the cut-off member

            started = now()
            assert (await client.get("x")).text == "new"
            assert now() - started < 0.3  # refused at once ("no leader"), not after waiting
            assert not client.current_endpoint.endswith(minority.endpoint)
            fence = [Compare("x", "VALUE", "new")]
            assert await client.txn(fence, [put_op("y", "fenced")]) is True
            assert (await client.get("y")).text == "fenced"

            # A watch refused by the cut-off member is created on a member of the majority.
            watcher = EtcdClient(etcd3.endpoints, request_timeout=0.5)
            events: list[WatchEvent] = []
            task = asyncio.create_task(collect(watcher.watch("z"), events))
            await eventually(lambda: not watcher.current_endpoint.endswith(minority.endpoint), 3,
                             "a watch on the majority")
            await asyncio.sleep(0.1)
            await client.put("z", "1")
            await eventually(lambda: bool(events), 3, "the watch event")
            task.cancel()
            await watcher.close()
        finally:
            await client.close()
            await alone.close()
    run(scenario())


async def _written(client: EtcdClient, key: str, value: str) -> bool:
    try:
        await client.put(key, value)
        return True
    except EtcdUnavailable:  # the majority may be electing a leader
        return False


async def _refuses(client: EtcdClient, reason: str) -> bool:
    try:
        await client.get("x")
    except EtcdUnavailable as e:
        return reason in str(e)
    return False


def test_without_a_majority_a_call_fails_within_its_bound_then_recovers(etcd3: EtcdCluster) -> None:
    async def scenario() -> None:
        first, *others = etcd3.members
        client = EtcdClient(etcd3.endpoints, request_timeout=0.5)
        alone = EtcdClient([first.endpoint], request_timeout=0.5)
        try:
            await client.put("k", "before")
            etcd3.pause(*others)
            await eventually(lambda: _refuses(alone, "no leader"), 10, "the remaining member to lose its leader")
            started = now()
            with pytest.raises(EtcdUnavailable) as raised:
                await client.txn([Compare("k", "VALUE", "before")], [put_op("k", "after")])
            assert now() - started < 3 * 0.5 + 0.4
            assert "no leader" in str(raised.value)
            started = now()
            with pytest.raises(EtcdUnavailable):
                await client.get("k", deadline=now() + 0.3)
            assert now() - started < 0.3 + 0.2

            etcd3.resume(*others)
            await eventually(lambda: _serves(client), 10, "the members to serve again")
            # The txn that timed out sat in a paused member's socket: it may be applied now, late.
            value = (await client.get("k")).text
            assert value in ("before", "after")
            assert await client.txn([Compare("k", "VALUE", value)], [put_op("k", "healed")]) is True
            assert (await client.get("k")).text == "healed"
        finally:
            etcd3.resume(*others)
            await client.close()
            await alone.close()
    run(scenario())


async def _serves(client: EtcdClient) -> bool:
    try:
        await client.get("k")
        return True
    except EtcdUnavailable:
        return False


# --- watches ----------------------------------------------------------------------------------------
def test_a_quiet_watch_stays_open_past_its_idle_timeout(etcd: Etcd) -> None:
    async def scenario() -> None:
        client = EtcdClient(etcd.endpoint, watch_idle_timeout=1.0)
        events: list[WatchEvent] = []
        try:
            task = asyncio.create_task(collect(client.watch("quiet"), events))
            await asyncio.sleep(3.5)  # progress reports keep it alive on a healthy member
            assert not task.done(), task.exception()
            await client.put("quiet", "at last")
            await eventually(lambda: bool(events), 2, "the event")
            assert events[0].kv.text == "at last"
            task.cancel()
        finally:
            await client.close()
    run(scenario())


def test_a_silent_watch_ends_within_its_idle_timeout_and_resumes_without_a_gap(etcd: Etcd) -> None:
    async def scenario() -> None:
        client = EtcdClient(etcd.endpoint, watch_idle_timeout=1.0)
        events: list[WatchEvent] = []
        watch = client.watch("s/", prefix=True)
        try:
            task = asyncio.create_task(collect(watch, events))
            await asyncio.sleep(0.3)
            await client.put("s/1", "seen")
            await eventually(lambda: bool(events), 2, "the first event")
            etcd.process.send_signal(signal.SIGSTOP)  # the stream stays open and nothing comes
            started = now()
            with pytest.raises(EtcdUnavailable, match="nothing heard"):
                await asyncio.wait_for(task, 5)
            assert 0.9 < now() - started < 1.0 + 0.5
        finally:
            etcd.process.send_signal(signal.SIGCONT)
        try:
            await client.put("s/2", "while down")
            await client.txn([], [put_op("s/3", "a"), put_op("s/4", "b")])  # two events, one revision
            resumed = watch.resume()
            seen = await asyncio.wait_for(first_events(resumed, 2), 3)  # mid-revision: s/4 not consumed
            assert [e.kv.key for e in seen] == ["s/2", "s/3"]
            again = await asyncio.wait_for(first_events(resumed.resume(), 2), 3)
            assert [e.kv.key for e in again] == ["s/3", "s/4"]  # that revision again, nothing before it
        finally:
            await client.close()
    run(scenario())


def test_a_watch_on_a_member_that_loses_its_majority_ends_and_resumes_elsewhere(etcd3: EtcdCluster) -> None:
    async def scenario() -> None:
        minority = etcd3.members[0]
        # A long idle timeout: the cut-off member still answers progress requests, so only its lost
        # leader can end this watch.
        client = EtcdClient(etcd3.endpoints, request_timeout=0.5, watch_idle_timeout=30)
        writer = EtcdClient(etcd3.endpoints[1:])
        events: list[WatchEvent] = []
        watch = client.watch("leader")
        try:
            task = asyncio.create_task(collect(watch, events))
            await asyncio.sleep(0.3)
            await writer.put("leader", "a")
            await eventually(lambda: bool(events), 3, "the first event")
            assert watch.endpoint.endswith(minority.endpoint)
            etcd3.isolate(minority)
            started = now()
            with pytest.raises(EtcdUnavailable, match="no leader"):
                await asyncio.wait_for(task, 10)
            assert now() - started < 8
            await writer.put("leader", "b")  # while no watch runs
            resumed = watch.resume()
            assert [e.kv.text for e in await asyncio.wait_for(first_events(resumed, 1), 3)] == ["b"]
            assert not resumed.endpoint.endswith(minority.endpoint)
        finally:
            etcd3.heal()
            await client.close()
            await writer.close()
    run(scenario())
