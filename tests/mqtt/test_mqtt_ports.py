"""A taken MQTT or MQTTS port stops the start as a taken AMQP port does: exit 1, one error line naming
the listener, the address and the port, nothing left listening."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.tls_certs import CA
from tests.service.broker_proc import broker_env, port_args


def _start_with(tmp_path: Path, flag: str, extra: list[str] | None = None) -> tuple[subprocess.CompletedProcess, int]:
    """Run the broker with ``flag`` set to a port another socket listens on."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "lavinpy", *port_args(tmp_path), *(extra or []), flag, str(port)],
                              cwd=tmp_path, env=broker_env(), capture_output=True, text=True, timeout=60)
    return proc, port


@pytest.mark.parametrize("flag,what", [("--amqp-port", "AMQP"), ("--mqtt-port", "MQTT")])
def test_a_taken_port_stops_the_start(tmp_path: Path, flag: str, what: str):
    proc, port = _start_with(tmp_path, flag)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"cannot start: [Errno 98] cannot listen for {what} on 127.0.0.1 port {port}: Address already in use" \
        in proc.stderr, proc.stderr
    assert "lavinpy started" not in proc.stderr


def test_a_taken_mqtts_port_stops_the_start(tmp_path: Path):
    cert, key, _ = CA(tmp_path / "pki").issue("server", server=True)
    conf = tmp_path / "tls.yaml"
    conf.write_text(f"tls_cert: {cert}\ntls_key: {key}\nhttps_port: 0\nprometheus_tls_port: 0\n")
    proc, port = _start_with(tmp_path, "--mqtts-port", ["--config", str(conf)])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"cannot listen for MQTTS on 127.0.0.1 port {port}: Address already in use" in proc.stderr, proc.stderr
