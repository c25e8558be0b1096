"""A replication leader for the tests: a real lavinpy Server with a ReplicationServer attached, on an
event loop in a thread (so the tests can read its ISR and follower status), and follower processes."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from lavinpy import config as config_module
from lavinpy.cluster import replication_protocol as proto
from lavinpy.cluster.replication_server import ReplicationServer
from lavinpy.server import Server
from tests.helpers import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
SECRET = b"the cluster's shared secret 0123456789"


class MemoryIsr:
    """The IsrWriter protocol kept in memory: every ISR written, with the time it was written."""

    def __init__(self) -> None:
        self.writes: list[tuple[float, list[str]]] = []  # each change of the members
        self.epoch = 0

    async def write_isr(self, members: list[str], epoch: int = 0) -> None:
        if not self.writes or self.writes[-1][1] != members:
            self.writes.append((time.monotonic(), list(members)))
        self.epoch = epoch

    @property
    def members(self) -> list[str]:
        return self.writes[-1][1] if self.writes else []


class Leader:
    def __init__(self, data_dir: Path, *, fsync: str = "always", secret: bytes = SECRET, **settings: Any) -> None:
        self.data_dir = Path(data_dir)
        self.secret = secret
        self.amqp_port = free_port()
        self.config = config_module.load(None, env={}, overrides={
            "data_dir": str(self.data_dir), "amqp_port": self.amqp_port, "http_port": 0,
            "prometheus_port": 0, "mqtt_port": 0, "bind": "127.0.0.1", "fsync": fsync, **settings})
        self.isr = MemoryIsr()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.server: Server | None = None
        self.replication: ReplicationServer | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/%2F"

    def call(self, make: Callable[[], Coroutine[Any, Any, Any]], timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(make(), self.loop).result(timeout)

    def start(self) -> Leader:
        self._thread.start()

        async def start() -> None:
            self.replication = ReplicationServer(self.data_dir, self.secret, "leader", self.isr, "127.0.0.1", 0)
            await self.replication.start()
            self.server = Server(self.config)
            self.replication.attach(self.server.broker)  # before any client can connect
            await self.server.start()
        self.call(start)
        return self

    def stop(self) -> None:
        async def stop() -> None:
            if self.replication is not None:
                await self.replication.stop()
            if self.server is not None:
                await self.server.stop()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:  # the broker's timers
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        try:
            self.call(stop)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)

    def status(self) -> list[dict]:
        assert self.replication is not None
        return self.call(lambda: _value(self.replication.follower_status()))

    def flush_all(self) -> None:
        """Wait until every vhost store is on disk and acknowledged by the ISR followers. A stream's
        tracked offsets and filter-value tags, otherwise written by its periodic timer (which may fire
        after a follower is stopped), are written first, so that they are part of what is compared."""
        async def flush() -> None:
            assert self.server is not None
            for vhost in self.server.broker.vhosts.values():
                vhost.write_queue_state()
                await vhost.store.flush()
        self.call(flush)

    def wait(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}: {self.status()}")
            time.sleep(0.05)

    def wait_caught_up(self, node_id: str, timeout: float = 30) -> None:
        def caught_up() -> bool:
            return any(f["id"] == node_id and f["in_sync"] and f["lag_bytes"] == 0 for f in self.status())
        self.wait(caught_up, timeout, f"{node_id} in sync with no lag")

    def wait_quiet(self, node_id: str, timeout: float = 30) -> None:
        """Stop the idle stream's heartbeats and wait until ``node_id`` has acknowledged everything up to
        the epoch stamped after the last change. From then on nothing is sent until the next change, so
        a stopped follower's ack clock starts with that change's bytes: not earlier, with a heartbeat or
        stamp a loaded machine left it no time to answer (the drop would then come sooner after it)."""
        assert self.replication is not None
        replication = self.replication
        replication.heartbeat_interval = 3600.0  # a heartbeat is a change: an epoch stamp follows it

        async def quiet() -> bool:
            lag = [f["lag_bytes"] for f in replication.follower_status() if f["id"] == node_id]
            return lag == [0] and replication._epoch_end == replication._log_end

        self.wait(lambda: bool(self.call(quiet)), timeout, f"{node_id} to acknowledge the last epoch stamp")


async def _value(value: Any) -> Any:
    return value


def start_follower(data_dir: Path, port: int, node_id: str = "follower", secret: bytes = SECRET) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.cluster.replication_follower", str(data_dir), secret.hex(), node_id,
         "127.0.0.1", str(port)], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)


def pause(pid: int, timeout: float = 10) -> None:
    """SIGSTOP, and wait until every thread of the process is stopped: the signal only asks, and on a
    loaded machine a thread may still run (and acknowledge a batch) after kill() returned."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while True:
        states = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                states.append((task / "stat").read_text().rpartition(")")[2].split()[0])
            except (OSError, IndexError):
                continue  # a thread that ended meanwhile
        if all(state in ("T", "t") for state in states):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} not stopped after {timeout} s: {states}")
        time.sleep(0.005)


def stop_process(process: subprocess.Popen) -> str:
    if process.poll() is None:
        try:
            process.send_signal(signal.SIGCONT)
            process.terminate()
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    output = process.stdout.read() if process.stdout else ""
    print(f"process {process.pid} exited {process.returncode}; its output:\n{output}")  # shown if a test fails
    return output


def replicated_hashes(root: Path) -> dict[str, str]:
    return {rel: hashlib.sha1(path.read_bytes()).hexdigest() for rel, path in proto.replicated_files(root)}
