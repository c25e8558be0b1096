"""Broker: a lavinpy process for a test suite, and the vhosts a test makes on it.

The broker is ``sys.executable -m lavinpy`` (the interpreter running the tests, with the lavinpy it
imports), in a temporary directory that holds its data dir and its log, on loopback ports the kernel
says are free: it runs beside a RabbitMQ or another lavinpy on the default ports, and beside the
brokers of parallel test workers.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

from .api import APIError, ManagementAPI, Message

__all__ = ["APIError", "Broker", "BrokerError", "Message", "VirtualHost"]

HOST = "127.0.0.1"
_DIR_PREFIX = "lavinpy-testing-"
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


class BrokerError(RuntimeError):
    """The broker did not start (the message ends with its log)."""


class VirtualHost(str):
    """A vhost made for a test: the string is its AMQP URL, the attributes the rest.

    A str, so that ``pika.URLParameters(broker.vhost())`` or ``Celery(broker=vhost)`` take it as is.
    """

    name: str
    broker: Broker

    def __new__(cls, broker: Broker, name: str) -> VirtualHost:
        self = super().__new__(cls, broker.amqp_url_for(name))
        self.name = name
        self.broker = broker
        return self

    def __reduce__(self) -> tuple[type[str], tuple[str]]:
        # A copy or a pickle (a library that deep-copies its settings) is the URL alone.
        return str, (str(self),)

    @property
    def amqp_url(self) -> str:
        return str(self)

    @property
    def http_url(self) -> str:
        return self.broker.http_url

    @property
    def mqtt_host(self) -> str:
        return self.broker.mqtt_host

    @property
    def mqtt_port(self) -> int:
        return self.broker.mqtt_port

    @property
    def mqtt_username(self) -> str:
        """The MQTT user name that selects this vhost ("vhost:user")."""
        return f"{self.name}:{self.broker.user}"

    @property
    def user(self) -> str:
        return self.broker.user

    @property
    def password(self) -> str:
        return self.broker.password

    def queues(self) -> list[str]:
        return self.broker.queues(self.name)

    def message_count(self, queue: str) -> int:
        return self.broker.message_count(queue, vhost=self.name)

    def get(self, queue: str, count: int = 1, requeue: bool = False) -> list[Message]:
        return self.broker.get(queue, count, requeue=requeue, vhost=self.name)

    def wait_for_messages(self, queue: str, count: int = 1, timeout: float = 10.0) -> int:
        return self.broker.wait_for_messages(queue, count, timeout, vhost=self.name)

    def delete(self) -> None:
        self.broker.delete_vhost(self.name)


class Broker:
    """A lavinpy broker in a subprocess; ``with Broker() as broker:`` or start() and stop().

    mqtt: also listen for MQTT (a free port). fsync: the broker's fsync policy ("never" by default: a
    test's messages need not survive a power cut, and fsyncs slow a test down on most disks). args:
    more command-line flags for ``python -m lavinpy``. python: the interpreter to run it with.
    """

    user = "guest"
    password = "guest"

    def __init__(self, *, mqtt: bool = True, fsync: str = "never", log_level: str = "info",
                 args: Sequence[str] = (), env: dict[str, str] | None = None, python: str | None = None,
                 start_timeout: float = 30.0) -> None:
        self.mqtt = mqtt
        self.fsync = fsync
        self.log_level = log_level
        self.args = list(args)
        self.extra_env = dict(env or {})
        self.python = python or sys.executable
        self.start_timeout = start_timeout
        self.host = HOST
        self.amqp_port = self.http_port = self.mqtt_port = 0
        self.workdir: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.start_seconds: float | None = None  # the last start's wall time, until the broker served
        self._api: ManagementAPI | None = None

    # -- addresses -------------------------------------------------------------------------------

    @property
    def amqp_url(self) -> str:
        """The default vhost ("/")."""
        return self.amqp_url_for("/")

    def amqp_url_for(self, vhost: str) -> str:
        return f"amqp://{self.user}:{self.password}@{self.host}:{self.amqp_port}/{quote(vhost, safe='')}"

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def mqtt_host(self) -> str:
        return self.host

    @property
    def data_dir(self) -> Path:
        if self.workdir is None:
            raise BrokerError("the broker has not been started")
        return self.workdir / "data"

    @property
    def log_path(self) -> Path:
        if self.workdir is None:
            raise BrokerError("the broker has not been started")
        return self.workdir / "lavinpy.log"

    @property
    def log(self) -> str:
        """What the broker logged so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    @property
    def api(self) -> ManagementAPI:
        if self._api is None:
            raise BrokerError("the broker has not been started")
        return self._api

    # -- the process ---------------------------------------------------------------------------------

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> Broker:
        """Start the broker and return once every listener accepts; BrokerError when it cannot."""
        if self.running():
            raise BrokerError("the broker is already running")
        if self.workdir is None:
            _sweep_stale_dirs()
            self.workdir = Path(tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{os.getpid()}-"))
            _running.add(self)
        # A port found free may be taken by someone else before the broker binds it: try new ones.
        for attempt in range(3):
            if attempt or not self.amqp_port:
                self.amqp_port, self.http_port, self.mqtt_port = _free_ports(3)
                if not self.mqtt:
                    self.mqtt_port = 0
            try:
                self._start_once()
                break
            except _PortTaken:
                continue
        else:
            raise BrokerError(f"no free ports after 3 tries:\n{self.log[-3000:]}")
        self._api = ManagementAPI(self.http_url, self.user, self.password)
        return self

    def _start_once(self) -> None:
        assert self.workdir is not None
        cmd = [self.python, "-m", "lavinpy", "--data-dir", str(self.data_dir), "--bind", self.host,
               "--amqp-port", str(self.amqp_port), "--http-port", str(self.http_port),
               "--mqtt-port", str(self.mqtt_port), "--prometheus-port", "0", "--amqps-port", "0",
               "--mqtts-port", "0", "--https-port", "0", "--prometheus-tls-port", "0",
               "--fsync", self.fsync, "--log-level", self.log_level, *self.args]
        began = time.monotonic()
        env = self._environment()
        with _ReadySignal() as ready:
            if ready.address:
                env["NOTIFY_SOCKET"] = ready.address
            with open(self.log_path, "ab") as log:
                log.write(f"===== {' '.join(cmd)}\n".encode())
                log.flush()
                # cwd: the work dir, so that a conf/lavinpy.yaml of the project under test is not read.
                self.proc = subprocess.Popen(cmd, cwd=self.workdir, env=env, stdin=subprocess.DEVNULL,
                                             stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent())
            (self.workdir / "broker.pid").write_text(str(self.proc.pid))
            deadline = began + self.start_timeout
            while not ready.wait(0.05, self.log_path):
                if self.proc.poll() is not None:
                    log_text = self.log
                    if "Address already in use" in log_text[-2000:]:
                        raise _PortTaken()
                    raise BrokerError(f"lavinpy exited with code {self.proc.returncode} while starting:\n"
                                      f"{log_text[-3000:]}")
                if time.monotonic() > deadline:
                    self._kill()
                    raise BrokerError(f"lavinpy did not start within {self.start_timeout} s:\n{self.log[-3000:]}")
        self.start_seconds = time.monotonic() - began

    def _environment(self) -> dict[str, str]:
        # LAVINPY_* settings of the caller's environment would change this broker (the codec switch is
        # not a setting: it passes); systemd's variables belong to the caller's own service.
        env = {k: v for k, v in os.environ.items()
               if (not k.startswith("LAVINPY_") or k == "LAVINPY_PURE_PYTHON")
               and k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
        # The lavinpy this process imported, also when it comes from a checkout on sys.path rather than
        # from an installed package (the child starts elsewhere, without the caller's sys.path).
        package_parent = str(Path(__file__).resolve().parents[2])
        if package_parent not in _site_dirs():
            env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH", "")) if p)
        env.update(self.extra_env)
        return env

    def stop(self, remove: bool = True) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after 10 s) and remove its directory unless ``remove`` is False."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self._kill()
        if remove and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
            _running.discard(self)

    def restart(self) -> None:
        """Stop and start again on the same ports and data dir (what a durable queue must survive)."""
        self.stop(remove=False)
        self.start()

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> Broker:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running() else "stopped"
        return f"<Broker {state} amqp={self.amqp_port} http={self.http_port} mqtt={self.mqtt_port}>"

    # -- vhosts and queues ---------------------------------------------------------------------------

    def vhost(self, name: str | None = None) -> VirtualHost:
        """A new vhost (a unique name by default) on which the user may do everything; its AMQP URL."""
        name = name or f"test-{uuid.uuid4().hex[:12]}"
        self.api.create_vhost(name, self.user)
        return VirtualHost(self, name)

    def delete_vhost(self, name: str) -> None:
        """Delete the vhost with its queues and exchanges (its connections are closed)."""
        self.api.delete_vhost(name)

    def queues(self, vhost: str = "/") -> list[str]:
        """The names of the vhost's queues."""
        return self.api.queues(vhost)

    def message_count(self, queue: str, vhost: str = "/") -> int:
        """The queue's messages, ready and unacknowledged."""
        return self.api.message_count(queue, vhost)

    def get(self, queue: str, count: int = 1, requeue: bool = False, vhost: str = "/") -> list[Message]:
        """Take up to ``count`` messages off the queue (put back when ``requeue``)."""
        return self.api.get(queue, vhost, count, requeue)

    def wait_for_messages(self, queue: str, count: int = 1, timeout: float = 10.0, vhost: str = "/") -> int:
        """Wait until the queue holds at least ``count`` messages (also until it exists); TimeoutError if not."""
        return self.api.wait_for_messages(queue, vhost, count, timeout)


class _PortTaken(Exception):
    pass


class _ReadySignal:
    """The broker's READY=1, sent (systemd's notify protocol) once every listener accepts, on a socket of
    our own: sooner than polling its ports. Where Linux's abstract socket names are missing, the log's
    started line stands in for it."""

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.address = ""
        if sys.platform.startswith("linux"):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            name = f"lavinpy-testing-{os.getpid()}-{uuid.uuid4().hex}"
            self.sock.bind("\0" + name)
            self.address = "@" + name

    def wait(self, seconds: float, log_path: Path) -> bool:
        if self.sock is None:
            time.sleep(seconds)
            try:
                return "lavinpy started" in log_path.read_text(errors="replace")
            except FileNotFoundError:
                return False
        self.sock.settimeout(seconds)
        try:
            return b"READY=1" in self.sock.recv(4096)
        except TimeoutError:
            return False

    def __enter__(self) -> _ReadySignal:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.sock is not None:
            self.sock.close()


def _free_ports(count: int) -> list[int]:
    # Bound together, so the kernel hands out distinct ports.
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind((HOST, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _site_dirs() -> set[str]:
    import site

    dirs = set(site.getsitepackages())
    with contextlib.suppress(AttributeError):
        dirs.add(site.getusersitepackages())
    return {str(Path(d).resolve()) for d in dirs}


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn that has the kernel kill the broker when this process dies (Linux), even by SIGKILL.

    The kernel's signal follows the thread that started the child: from any other thread than the
    main one the broker would die with that thread, so there only atexit stops it.
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork, only called after it
    parent = os.getpid()

    def set_up() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the line above: nobody would signal
            os._exit(1)

    return set_up


# Brokers still running when the interpreter exits normally; a killed interpreter's are killed by the
# kernel (above) and their directories removed by the next start (_sweep_stale_dirs).
_running: weakref.WeakSet[Broker] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for broker in list(_running):
        with contextlib.suppress(Exception):
            broker.stop()


def _sweep_stale_dirs() -> None:
    """Remove the directories of brokers whose test process died without cleaning up."""
    pattern = re.compile(re.escape(_DIR_PREFIX) + r"(\d+)-")
    root = Path(tempfile.gettempdir())
    try:
        entries = list(root.iterdir())
    except OSError:
        return
    for entry in entries:
        match = pattern.match(entry.name)
        if match is None or int(match.group(1)) == os.getpid():
            continue
        try:
            if entry.stat().st_uid != os.getuid():
                continue
            child = int((entry / "broker.pid").read_text() or 0) if (entry / "broker.pid").exists() else 0
        except (OSError, ValueError):
            continue
        if not _alive(int(match.group(1))) and not (child and _alive(child)):
            shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
