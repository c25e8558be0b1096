"""Fixtures for the end-to-end tests.

By default every test talks to a real lavinpy server started here as a subprocess
(`python -m lavinpy --data-dir DIR --amqp-port N --http-port M ...`, cwd = a temporary directory).

Environment:
  LAVINPY_TEST_URL        use the broker at this URL instead (e.g. a RabbitMQ on 127.0.0.1:5672).
                          Tests that need to kill the server or read its files are skipped.
  LAVINPY_TEST_HTTP_URL   with LAVINPY_TEST_URL: that broker's management API (e.g. http://127.0.0.1:15672).
  LAVINPY_TEST_RABBITMQCTL  with LAVINPY_TEST_URL: the rabbitmqctl command line (e.g.
                          "rabbitmqctl -n rabbit@localhost"). Enables the permission tests (users,
                          vhosts and permissions are made with it) and the restart tests
                          (stop_app / start_app stand in for stopping and starting the server).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import resource
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

import pika
import pytest

from tests.helpers import free_ports, http_request

REPO_ROOT = Path(__file__).resolve().parents[2]
EXTERNAL_URL = os.environ.get("LAVINPY_TEST_URL", "").strip()
RABBITMQCTL = os.environ.get("LAVINPY_TEST_RABBITMQCTL", "").strip()
EXTERNAL_HTTP_URL = os.environ.get("LAVINPY_TEST_HTTP_URL", "").strip()
DEFAULT_TIMEOUT = 60
STARTED_LINE = "INFO lavinpy: lavinpy started"

ON_LAVINPY = not EXTERNAL_URL


def lavinpy_only(reason: str = "needs a lavinpy server started by the tests"):
    return pytest.mark.skipif(not ON_LAVINPY, reason=reason)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(DEFAULT_TIMEOUT))


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class LocalBroker:
    """A lavinpy server run as a subprocess on its own data dir and port."""

    external = False

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.data_dir = workdir / "data"
        self.log_path = workdir / "lavinpy.log"
        self.host = "127.0.0.1"
        self.port, self.http_port, self.prometheus_port = free_ports(3)
        self.proc: subprocess.Popen[bytes] | None = None
        self.extra_args: list[str] = []
        self.fd_limit: int | None = None  # the server's RLIMIT_NOFILE (None: inherited)
        self.settings: dict[str, str] = {}  # settings passed as LAVINPY_<NAME> variables

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.host}:{self.port}/"

    def url_for(self, user: str, password: str, vhost: str = "/") -> str:
        return f"amqp://{quote(user, safe='')}:{quote(password, safe='')}@{self.host}:{self.port}/" \
               f"{quote(vhost, safe='')}"

    @property
    def http_url(self) -> str:
        """The management API's base URL (no credentials)."""
        return f"http://{self.host}:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        """The Prometheus endpoint's base URL."""
        return f"http://{self.host}:{self.prometheus_port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 20.0) -> None:
        assert not self.running(), "broker already running"
        # The broker's settings come from the command line and self.settings only; the codec switch passes
        # through, so the whole suite runs on the path it selects.
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("LAVINPY_") or k == "LAVINPY_PURE_PYTHON"}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        env.update({f"LAVINPY_{name.upper()}": value for name, value in self.settings.items()})
        cmd = [sys.executable, "-m", "lavinpy", "--data-dir", str(self.data_dir),
               "--amqp-port", str(self.port), "--http-port", str(self.http_port),
               "--prometheus-port", str(self.prometheus_port), "--log-level", "info",
               "--fsync", "always", "--mqtt-port", "0", "--mqtts-port", "0", *self.extra_args]
        started_before = self.log.count(STARTED_LINE)
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== start {' '.join(cmd[1:])}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(cmd, cwd=self.workdir, env=env, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, preexec_fn=self._limit_fds)
        deadline = time.monotonic() + timeout
        # The started line is logged once every listener is bound (and the server handles SIGTERM only from
        # then on). No port is probed: a probe on the AMQP port is a connection the broker accepts, counts in
        # its connection metrics and closes, later, while the test already runs and reads those metrics.
        while self.log.count(STARTED_LINE) <= started_before:
            if self.proc.poll() is not None:
                pytest.fail(f"lavinpy exited with code {self.proc.returncode} while starting:\n"
                            f"{self.log[-4000:]}")
            if time.monotonic() > deadline:
                self.kill9()
                pytest.fail(f"lavinpy did not listen on port {self.port} within {timeout} s:\n"
                            f"{self.log[-4000:]}")
            time.sleep(0.05)

    def _limit_fds(self) -> None:
        if self.fd_limit is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (self.fd_limit, self.fd_limit))

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM; the server must exit with code 0 within timeout."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill9()
            pytest.fail(f"lavinpy did not exit within {timeout} s of SIGTERM:\n{self.log[-4000:]}")
        assert rc == 0, f"lavinpy exited with code {rc} on SIGTERM:\n{self.log[-4000:]}"

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        """Teardown: stop cleanly when possible (and assert it), else make sure it is gone."""
        if self.running():
            self.stop()


class ExternalBroker:
    """A broker the tests do not own (LAVINPY_TEST_URL), e.g. RabbitMQ."""

    external = True

    def __init__(self, url: str) -> None:
        u = urlparse(url)
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or 5672
        self.url = url

    @property
    def http_url(self) -> str:
        if not EXTERNAL_HTTP_URL:
            pytest.skip("external broker: set LAVINPY_TEST_HTTP_URL to test its management API")
        return EXTERNAL_HTTP_URL.rstrip("/")

    def url_for(self, user: str, password: str, vhost: str = "/") -> str:
        return f"amqp://{quote(user, safe='')}:{quote(password, safe='')}@{self.host}:{self.port}/" \
               f"{quote(vhost, safe='')}"

    @property
    def data_dir(self) -> Path:
        pytest.skip("external broker: its files are not accessible")

    @property
    def pid(self) -> int:
        pytest.skip("external broker: no process to signal")

    @property
    def log(self) -> str:
        return ""

    def running(self) -> bool:
        return True

    def _ctl(self, *args: str) -> None:
        if not RABBITMQCTL:
            pytest.skip("external broker: set LAVINPY_TEST_RABBITMQCTL to allow stopping/starting it")
        rabbitmqctl(*args)

    def stop(self) -> None:
        self._ctl("stop_app")

    def start(self) -> None:
        self._ctl("start_app")
        deadline = time.monotonic() + 30
        while not port_open(self.host, self.port):
            assert time.monotonic() < deadline, "external broker did not come back"
            time.sleep(0.1)

    def restart(self) -> None:
        self.stop()
        self.start()

    def kill9(self) -> None:
        pytest.skip("external broker: cannot kill -9 it")

    def close(self) -> None:
        pass


@pytest.fixture
def rabbit(tmp_path: Path) -> Iterator[Any]:
    """A private RabbitMQ node (rabbitmq_node.py), started for this test and stopped after it."""
    from .rabbitmq_node import RabbitNode  # it imports this module
    node = RabbitNode(tmp_path / "rabbitmq")
    node.start()
    try:
        yield node
    finally:
        node.stop()


def rabbitmqctl(*args: str) -> str:
    cmd = [*shlex.split(RABBITMQCTL), *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stdout}{r.stderr}")
    return r.stdout


Broker = LocalBroker | ExternalBroker


def shared_by_many_tests(broker: LocalBroker) -> None:
    """A broker many tests share: their deliberate failed logins (all from 127.0.0.1) must not make the login
    throttle delay every later login of every test for a minute (up to 3 s each); the throttle's own tests
    use a broker of their own with the default."""
    broker.settings["login_free_failures"] = str(10**9)


@pytest.fixture(scope="session")
def _session_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    if EXTERNAL_URL:
        yield ExternalBroker(EXTERNAL_URL)
        return
    b = LocalBroker(tmp_path_factory.mktemp("lavinpy-session"))
    shared_by_many_tests(b)
    b.start()
    yield b
    b.close()


@pytest.fixture
def broker(_session_broker: Broker) -> Iterator[Broker]:
    """A broker shared by the tests that do not restart it (unique names keep them apart)."""
    b = _session_broker
    if isinstance(b, LocalBroker) and not b.running():
        b.proc = None
        b.start()
    yield b
    if isinstance(b, LocalBroker) and not b.running():
        pytest.fail(f"lavinpy died during this test (exit code {b.proc.returncode if b.proc else '?'}):\n"
                    f"{b.log[-4000:]}")


@pytest.fixture
def fresh_broker(tmp_path: Path) -> Iterator[Broker]:
    """A broker of this test's own, which it may stop, restart or kill."""
    if EXTERNAL_URL:
        b = ExternalBroker(EXTERNAL_URL)
        yield b
        return
    b = LocalBroker(tmp_path / "broker")
    b.start()
    try:
        yield b
    finally:
        if b.running():
            b.stop()


class Clients:
    """Makes pika connections to a broker and closes them all at teardown; deletes tracked objects."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.connections: list[pika.BlockingConnection] = []
        self.queues: list[str] = []
        self.exchanges: list[str] = []

    def connect(self, url: str | None = None, **params: Any) -> pika.BlockingConnection:
        p = pika.URLParameters(url or self.broker.url)
        p.connection_attempts = 1
        p.socket_timeout = 10
        p.blocked_connection_timeout = 30
        for k, v in params.items():
            setattr(p, k, v)
        conn = pika.BlockingConnection(p)
        self.connections.append(conn)
        return conn

    def channel(self, url: str | None = None, **params: Any):
        conn = self.connect(url, **params)
        return conn, conn.channel()

    def track_queue(self, name: str) -> str:
        self.queues.append(name)
        return name

    def track_exchange(self, name: str) -> str:
        self.exchanges.append(name)
        return name

    def close_connections(self) -> None:
        for conn in self.connections:
            try:
                if conn.is_open:
                    conn.close()
            except Exception:
                pass
        self.connections.clear()

    def close(self) -> None:
        """Teardown: close every connection, then delete the tracked queues and exchanges."""
        self.close_connections()
        if (self.queues or self.exchanges) and self.broker.running():
            try:
                conn = pika.BlockingConnection(pika.URLParameters(self.broker.url))
            except Exception:
                return
            try:
                for name in self.queues:
                    ch = conn.channel()
                    try:
                        ch.queue_delete(name)
                        ch.close()
                    except Exception:
                        pass
                for name in self.exchanges:
                    ch = conn.channel()
                    try:
                        ch.exchange_delete(name)
                        ch.close()
                    except Exception:
                        pass
            finally:
                try:
                    conn.close()
                except Exception:
                    pass


@pytest.fixture
def clients(broker: Broker) -> Iterator[Clients]:
    c = Clients(broker)
    yield c
    c.close()


@pytest.fixture
def fresh_clients(fresh_broker: Broker) -> Iterator[Clients]:
    c = Clients(fresh_broker)
    yield c
    c.close()


# --- users, vhosts and permissions ------------------------------------------------------------

def rabbit_password_hash(password: str, salt: bytes | None = None) -> str:
    """RabbitMQ's rabbit_password_hashing_sha256: base64(salt + sha256(salt + password))."""
    salt = os.urandom(4) if salt is None else salt
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


class FileAdmin:
    """lavinpy: users and vhosts live in <data_dir>/users.json and vhosts.json, edited while it is stopped.

    Changes are collected and written by apply(), which stops the broker, edits the files and starts it.
    """

    def __init__(self, broker: LocalBroker) -> None:
        self.broker = broker
        self.users: dict[str, dict[str, Any]] = {}
        self.vhosts: list[str] = []
        self.perms: list[tuple[str, str, str, str, str]] = []

    def add_vhost(self, name: str) -> None:
        self.vhosts.append(name)

    def add_user(self, name: str, password: str, tags: tuple[str, ...] = ()) -> None:
        self.users[name] = {"name": name, "password_hash": rabbit_password_hash(password),
                            "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": list(tags),
                            "permissions": {}}

    def set_permissions(self, user: str, vhost: str, configure: str, write: str, read: str) -> None:
        self.perms.append((user, vhost, configure, write, read))

    def apply(self) -> None:
        b = self.broker
        if b.running():
            b.stop()
        users_path, vhosts_path = b.data_dir / "users.json", b.data_dir / "vhosts.json"
        users = json.loads(users_path.read_text()) if users_path.exists() else [
            {"name": "guest", "password_hash": rabbit_password_hash("guest"),
             "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": ["administrator"],
             "permissions": {"/": {"configure": ".*", "write": ".*", "read": ".*"}}}]
        vhosts = json.loads(vhosts_path.read_text()) if vhosts_path.exists() else [
            {"name": "/", "description": "Default virtual host", "tags": []}]
        by_name = {u["name"]: u for u in users}
        by_name.update(self.users)
        for user, vhost, c, w, r in self.perms:
            by_name[user].setdefault("permissions", {})[vhost] = {"configure": c, "write": w, "read": r}
        known = {v["name"] for v in vhosts}
        for v in self.vhosts:
            if v not in known:
                vhosts.append({"name": v, "description": "", "tags": []})
        b.data_dir.mkdir(parents=True, exist_ok=True)
        users_path.write_text(json.dumps(list(by_name.values()), indent=2))
        vhosts_path.write_text(json.dumps(vhosts, indent=2))
        self.users.clear()
        self.vhosts.clear()
        self.perms.clear()
        b.start()

    def cleanup(self) -> None:
        pass


class CtlAdmin:
    """RabbitMQ: the same operations through rabbitmqctl, applied at once."""

    def __init__(self) -> None:
        self.created_users: list[str] = []
        self.created_vhosts: list[str] = []

    def add_vhost(self, name: str) -> None:
        rabbitmqctl("add_vhost", name)
        self.created_vhosts.append(name)

    def add_user(self, name: str, password: str, tags: tuple[str, ...] = ()) -> None:
        rabbitmqctl("add_user", name, password)
        self.created_users.append(name)
        if tags:
            rabbitmqctl("set_user_tags", name, *tags)

    def set_permissions(self, user: str, vhost: str, configure: str, write: str, read: str) -> None:
        rabbitmqctl("set_permissions", "-p", vhost, user, configure, write, read)

    def apply(self) -> None:
        pass

    def cleanup(self) -> None:
        for u in self.created_users:
            try:
                rabbitmqctl("delete_user", u)
            except RuntimeError:
                pass
        for v in self.created_vhosts:
            try:
                rabbitmqctl("delete_vhost", v)
            except RuntimeError:
                pass


def make_admin(b: Broker) -> FileAdmin | CtlAdmin:
    if isinstance(b, LocalBroker):
        return FileAdmin(b)
    if not RABBITMQCTL:
        pytest.skip("external broker: set LAVINPY_TEST_RABBITMQCTL to manage users and vhosts")
    return CtlAdmin()


# --- management HTTP API ----------------------------------------------------------------------

def http_call(broker: Broker, method: str, path: str, body: Any = None, *, user: str = "guest",
              password: str = "guest", raw: bytes | None = None,
              headers: dict[str, str] | None = None) -> tuple[int, Any, dict[str, str]]:
    """One request to the broker's management API (tests.helpers.http_request at its HTTP URL)."""
    return http_request(broker.http_url, method, path, body, user=user, password=password, raw=raw, headers=headers)
