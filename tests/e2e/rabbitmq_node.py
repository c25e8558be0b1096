"""A private RabbitMQ node (Debian's rabbitmq-server) for the tests that talk to a real RabbitMQ: its own
node name, ports below the ephemeral range, data, config and plugins file (management and shovel), loopback
only. Used by the interop, definitions, limits and shovel tests (the ``rabbit`` fixture is in conftest.py).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
from pathlib import Path

import pytest

from tests.helpers import free_port

from .conftest import http_call

RABBITMQ_SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
needs_rabbitmq = pytest.mark.skipif(not RABBITMQ_SERVER.exists(), reason="rabbitmq-server is not installed")


class RabbitNode:
    def __init__(self, base: Path) -> None:
        self.base = base
        # Below the ephemeral range: the node is restarted on these ports, and a client reconnecting
        # meanwhile could otherwise be handed one of them as its own source port and keep it.
        self.port = free_port(below_ephemeral=True)
        self.http_port = free_port(below_ephemeral=True)
        self.host = "127.0.0.1"
        self.proc: subprocess.Popen[bytes] | None = None
        self.plugins = ["rabbitmq_management", "rabbitmq_shovel"]  # a test may add more before start

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    def url_for(self, user: str, password: str, vhost: str) -> str:
        from urllib.parse import quote
        return f"amqp://{quote(user, safe='')}:{quote(password, safe='')}@{self.host}:{self.port}/" \
               f"{quote(vhost, safe='')}"

    def start(self, timeout: float = 60.0) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        # The shovel plugin too: its shovel parameters are part of the exports the migration tests import.
        (self.base / "enabled_plugins").write_text(f"[{','.join(self.plugins)}].\n")
        (self.base / "rabbitmq.conf").write_text(
            f"management.tcp.port = {self.http_port}\nmanagement.tcp.ip = 127.0.0.1\n")
        env = dict(os.environ, HOME=str(self.base),
                   RABBITMQ_NODENAME=f"lpinterop{self.port}@localhost",
                   RABBITMQ_NODE_IP_ADDRESS="127.0.0.1", RABBITMQ_NODE_PORT=str(self.port),
                   RABBITMQ_DIST_PORT=str(free_port(below_ephemeral=True)), ERL_EPMD_ADDRESS="127.0.0.1",
                   RABBITMQ_MNESIA_BASE=str(self.base / "mnesia"), RABBITMQ_LOG_BASE=str(self.base / "log"),
                   RABBITMQ_ENABLED_PLUGINS_FILE=str(self.base / "enabled_plugins"),
                   RABBITMQ_CONFIG_FILE=str(self.base / "rabbitmq"))
        with open(self.base / "console.log", "ab") as log:
            self.proc = subprocess.Popen([str(RABBITMQ_SERVER)], env=env, cwd=self.base, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                pytest.skip(f"rabbitmq-server exited with {self.proc.returncode} while starting")
            try:
                # The management API answers before the AMQP listener has started: wait for both.
                if http_call(self, "GET", "/api/overview")[0] == 200:
                    socket.create_connection((self.host, self.port), timeout=1).close()
                    return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                pytest.skip(f"RabbitMQ's management API did not answer within {timeout} s")
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
