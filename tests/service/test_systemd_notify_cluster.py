"""Type=notify for a cluster node: READY=1 once its client ports accept, then pings, STOPPING=1 on SIGTERM."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import free_port

from .broker_proc import broker_env, receive, start, stop


def start_etcd(directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    client, peer = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    with open(directory / "etcd.log", "ab") as log:
        proc = subprocess.Popen(["etcd", "--name", "n", "--data-dir", str(directory / "etcd"),
                                 "--listen-client-urls", client, "--advertise-client-urls", client,
                                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                                 "--initial-cluster", f"n={peer}"], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 15
    while True:
        try:
            with urllib.request.urlopen(f"{client}/health", timeout=1):
                return proc, client.removeprefix("http://")
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise AssertionError("etcd did not answer") from None
            time.sleep(0.1)


@pytest.mark.timeout(90)
def test_cluster_node_reports_ready_pings_and_stopping(tmp_path: Path):
    if shutil.which("etcd") is None:
        pytest.skip("the etcd binary is missing (Debian: apt-get install etcd-server)")
    etcd, endpoint = start_etcd(tmp_path)
    directory = tempfile.mkdtemp(prefix="lvnotify")
    name = os.path.join(directory, "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(name)
    sock.settimeout(0.2)
    amqp_port = free_port()
    args = ["--data-dir", str(tmp_path / "data"), "--bind", "127.0.0.1", "--amqp-port", str(amqp_port),
            "--http-port", str(free_port()), "--prometheus-port", "0", "--mqtt-port", "0", "--clustering",
            "--clustering-etcd-endpoints", endpoint, "--clustering-bind", "127.0.0.1",
            "--clustering-port", str(free_port())]
    proc = start(args, tmp_path, broker_env({"NOTIFY_SOCKET": name, "WATCHDOG_USEC": "400000"}))
    try:
        got = receive(sock, "READY=1", timeout=45)
        assert "STOPPING=1" not in got
        with socket.create_connection(("127.0.0.1", amqp_port), timeout=2):
            pass
        assert "WATCHDOG=1" in receive(sock, "WATCHDOG=1", timeout=5)
        rc = stop(proc)
        assert rc == 0, (tmp_path / "stderr").read_text()[-3000:]
        assert "STOPPING=1" in receive(sock, "STOPPING=1", timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
        sock.close()
        shutil.rmtree(directory, ignore_errors=True)
        etcd.kill()
        etcd.wait(10)
