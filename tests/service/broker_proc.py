"""A lavinpy process started with given flags and environment, for the service tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import free_port

REPO = Path(__file__).resolve().parents[2]


def broker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The caller's environment without LAVINPY_* settings (the codec switch passes through)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("LAVINPY_") or k == "LAVINPY_PURE_PYTHON"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def port_args(tmp_path: Path) -> list[str]:
    """A data dir and free ports; the HTTP API on, Prometheus off."""
    return ["--data-dir", str(tmp_path / "data"), "--bind", "127.0.0.1", "--amqp-port", str(free_port()),
            "--http-port", str(free_port()), "--prometheus-port", "0", "--amqps-port", "0",
            "--mqtt-port", "0", "--mqtts-port", "0"]


def start(args: list[str], tmp_path: Path, env: dict[str, str] | None = None, python: str = sys.executable,
          stderr_path: Path | None = None) -> subprocess.Popen[bytes]:
    """Start ``python -m lavinpy ARGS`` in tmp_path; its stderr goes to ``stderr_path`` (default tmp_path/stderr)."""
    stderr_path = stderr_path or tmp_path / "stderr"
    with open(stderr_path, "ab") as err:
        return subprocess.Popen([python, "-m", "lavinpy", *args], cwd=tmp_path, env=env or broker_env(),
                                stdin=subprocess.DEVNULL, stdout=err, stderr=subprocess.STDOUT)


def wait_for(predicate, proc: subprocess.Popen[bytes], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"lavinpy exited with {proc.returncode} before {what}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise AssertionError(f"no {what} within {timeout} s")
        time.sleep(0.05)


def stop(proc: subprocess.Popen[bytes], timeout: float = 20.0) -> int:
    """SIGTERM and the exit code (killed after ``timeout``)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


def receive(sock: socket.socket, until: str, timeout: float) -> list[str]:
    """Every message until one containing ``until`` (inclusive), one line per message field."""
    got: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            data = sock.recv(4096)
        except TimeoutError:
            continue
        got += data.decode().splitlines()
        if until in got:
            return got
    raise AssertionError(f"{until} not received within {timeout} s; got {got}")
