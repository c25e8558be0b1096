"""A lavinpy broker process for the bench scripts: free ports, its own data dir, started from a given
tree (this one, or an old checkout to compare with), its CPU read from /proc.

    broker = BrokerProcess(workdir, http=True, settings={"auth_backends": ["local"]})
    ... broker.amqp_port, broker.cpu_seconds() ...
    broker.stop()
"""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of a process, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _raise_fd_limit() -> None:
    """In the broker's process: every durable queue and stream holds files open."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class BrokerProcess:
    """``repo``'s lavinpy on free ports with its data under ``workdir`` and ``fsync never``, warnings
    only in ``workdir/broker.log``; ``http``: the management and metrics ports too (else off);
    ``settings``: a config file's contents. Options an older tree lacks are left out (its config.py
    says which it has). Returns once every port it opened takes connections."""

    def __init__(self, workdir: Path, *, repo: Path = REPO, http: bool = False,
                 settings: dict[str, Any] | None = None, start_timeout: float = 60) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        known = (repo / "lavinpy" / "config.py").read_text()
        self.amqp_port = free_port()
        self.http_port = free_port() if http else 0
        self.prometheus_port = free_port() if http and "prometheus_port" in known else 0
        env = {k: v for k, v in os.environ.items() if not k.startswith("LAVINPY_")}
        env["PYTHONPATH"] = str(repo)
        cmd = [sys.executable, "-m", "lavinpy", "--data-dir", str(workdir / "data"), "--amqp-port",
               str(self.amqp_port), "--http-port", str(self.http_port), "--log-level", "warning", "--fsync", "never"]
        for option, port in (("mqtt_port", 0), ("mqtts_port", 0), ("prometheus_port", self.prometheus_port)):
            if option in known:
                cmd += [f"--{option.replace('_', '-')}", str(port)]
        if settings is not None:
            conf = workdir / "bench.yaml"
            conf.write_text(json.dumps(settings))  # JSON is YAML
            cmd += ["--config", str(conf)]
        self.log_path = workdir / "broker.log"
        self.log = open(self.log_path, "ab")  # noqa: SIM115 - open while the broker runs
        self.proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     preexec_fn=_raise_fd_limit)
        deadline = time.monotonic() + start_timeout
        while not self._listening():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the broker did not start: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.1)

    def _listening(self) -> bool:
        for port in (self.amqp_port, self.http_port, self.prometheus_port):
            if not port:
                continue
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            except OSError:
                return False
        return True

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(60)
        self.log.close()
