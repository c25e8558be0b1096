"""Type=notify: a unix datagram socket stands in for systemd and reads what the broker sends."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lavinpy.systemd_notify import Notifier

from .broker_proc import REPO, broker_env, port_args, receive, start, stop


@pytest.fixture(params=["path", "abstract"])
def systemd_socket(request: pytest.FixtureRequest) -> Iterator[tuple[socket.socket, str]]:
    """A bound datagram socket and the NOTIFY_SOCKET value naming it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if request.param == "path":
        # A short directory: unix socket paths are limited to 107 bytes, pytest's tmp_path can be longer.
        directory = tempfile.mkdtemp(prefix="lvnotify")
        name = os.path.join(directory, "notify")
        sock.bind(name)
    else:
        name = f"@lavinpy-notify-test-{os.getpid()}-{time.monotonic_ns()}"
        sock.bind("\0" + name[1:])
    sock.settimeout(0.2)
    yield sock, name
    sock.close()
    if request.param == "path":
        os.unlink(name)
        os.rmdir(directory)


def test_ready_watchdog_and_stopping_arrive_in_order(tmp_path: Path, systemd_socket: tuple[socket.socket, str]):
    sock, name = systemd_socket
    args = port_args(tmp_path)
    amqp_port = int(args[args.index("--amqp-port") + 1])
    proc = start(args, tmp_path, broker_env({"NOTIFY_SOCKET": name, "WATCHDOG_USEC": "400000"}))
    try:
        got = receive(sock, "READY=1", timeout=30)
        # READY means serving: the AMQP port accepts at that moment.
        with socket.create_connection(("127.0.0.1", amqp_port), timeout=2):
            pass
        assert not [m for m in got if m in ("WATCHDOG=1", "STOPPING=1")], got
        # Pings every 0.2 s (half of WATCHDOG_USEC): at least 4 within 1.2 s.
        started = time.monotonic()
        pings = 0
        while time.monotonic() - started < 1.2:
            try:
                pings += sock.recv(4096).decode().splitlines().count("WATCHDOG=1")
            except TimeoutError:
                pass
        assert pings >= 4, pings
    finally:
        rc = stop(proc)
    assert rc == 0, (tmp_path / "stderr").read_text()[-3000:]
    after = receive(sock, "STOPPING=1", timeout=5)
    assert "READY=1" not in after
    log = (tmp_path / "stderr").read_text()
    assert "not sent" not in log, log[-3000:]


def test_no_socket_no_notifications_and_the_watchdog_belongs_to_its_pid():
    assert not Notifier({}).enabled and not Notifier({}).notify("READY=1")
    assert Notifier({"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "1000000"}).watchdog_interval == 0.5
    assert Notifier({"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "0"}).watchdog_interval is None
    # systemd names the process it watches; a child that inherited the variables must not ping for it.
    other = Notifier({"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": str(os.getpid() + 1)})
    assert other.watchdog_interval is None
    mine = Notifier({"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": str(os.getpid())})
    assert mine.watchdog_interval == 0.5


def test_an_absent_socket_is_logged_and_the_broker_runs_on(tmp_path: Path):
    proc = start(port_args(tmp_path), tmp_path,
                 broker_env({"NOTIFY_SOCKET": f"@lavinpy-nobody-listens-{os.getpid()}"}))
    try:
        deadline = time.monotonic() + 30
        while "lavinpy started" not in (tmp_path / "stderr").read_text() and time.monotonic() < deadline:
            assert proc.poll() is None
            time.sleep(0.05)
        time.sleep(0.3)
        assert proc.poll() is None
    finally:
        assert stop(proc) == 0
    log = (tmp_path / "stderr").read_text()
    assert "systemd notification 'READY=1\\nSTATUS=serving' not sent" in log, log[-3000:]


def test_the_shipped_unit_verifies_and_is_type_notify(tmp_path: Path):
    unit = (REPO / "conf" / "lavinpy.service").read_text()
    assert "\nType=notify\n" in unit and "\nWatchdogSec=" in unit and "\nNotifyAccess=main\n" in unit
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("no systemd-analyze to verify the unit with")
    # The unit names the install location; verify checks that ExecStart exists, so point it at this Python.
    [exec_start] = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    local = unit.replace(exec_start.split()[0], f"ExecStart={sys.executable} -m lavinpy")
    (tmp_path / "lavinpy.service").write_text(local)
    proc = subprocess.run([analyze, "verify", str(tmp_path / "lavinpy.service")], capture_output=True, text=True,
                          timeout=60)
    problems = [line for line in (proc.stdout + proc.stderr).splitlines() if "lavinpy.service" in line]
    assert proc.returncode == 0 and not problems, proc.stdout + proc.stderr
