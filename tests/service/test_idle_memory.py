"""A started, idle broker's RSS: what the interpreter, the imports and the empty broker cost.

The bounds are the figures measured when this test was written (Python 3.11, x86-64: 48 MiB with
every listener on, 32-33 MiB with only AMQP, compiled or pure Python) with room for other builds of
the same libraries; an import that is not needed at start (the YAML parser without a settings file)
shows up here as a larger RSS and as its extension module in the process's mappings. The HTTP stack
(aiohttp and the API's routes, 15-17 MiB) is loaded by the first connection to its ports: every listener
on, the idle broker measured 35-36 MiB, and 52-53 after one request to the API.
"""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import free_port

from .broker_proc import start, stop, wait_for

MIB = 1024
EVERY_LISTENER_BOUND = 46 * MIB  # KiB (before a request to the HTTP API; 60 while it was loaded at start)
AMQP_ONLY_BOUND = 44 * MIB


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def mapped_files(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as f:
        return f.read()


def started(tmp_path: Path, ports: dict[str, int]) -> subprocess.Popen[bytes]:
    args = ["--data-dir", str(tmp_path / "data"), "--bind", "127.0.0.1", "--amqps-port", "0", "--mqtts-port", "0"]
    for name, port in ports.items():
        args += [f"--{name}-port", str(port)]
    proc = start(args, tmp_path)
    for port in ports.values():
        if port:
            wait_for(lambda port=port: listening(port), proc, f"a listener on {port}")
    return proc


@pytest.mark.parametrize("every_listener", [True, False], ids=["every-listener", "amqp-only"])
def test_idle_rss_stays_under_the_measured_bound(tmp_path: Path, every_listener: bool) -> None:
    if every_listener:  # the defaults: AMQP, MQTT, the management API and /metrics (on free ports)
        ports = {"amqp": free_port(), "mqtt": free_port(), "http": free_port(), "prometheus": free_port()}
        bound = EVERY_LISTENER_BOUND
    else:  # as bench/compare.py starts it
        ports = {"amqp": free_port(), "mqtt": 0, "http": 0, "prometheus": 0}
        bound = AMQP_ONLY_BOUND
    proc = started(tmp_path, ports)
    try:
        rss = status_kb(proc.pid, "VmRSS")
        maps = mapped_files(proc.pid)
    finally:
        assert stop(proc) == 0
    assert rss < bound, f"idle RSS {rss} KiB, bound {bound} KiB"
    assert "yaml/_yaml" not in maps, "the YAML parser is loaded without a settings file"
    assert "aiohttp" not in maps, "aiohttp is loaded before a connection to an HTTP port"


def test_the_first_request_loads_the_http_api_and_answers(tmp_path: Path) -> None:
    ports = {"amqp": free_port(), "mqtt": 0, "http": free_port(), "prometheus": free_port()}
    proc = started(tmp_path, ports)
    try:
        assert "aiohttp" not in mapped_files(proc.pid)
        auth = "Basic " + base64.b64encode(b"guest:guest").decode()
        request = urllib.request.Request(f"http://127.0.0.1:{ports['http']}/api/overview",
                                         headers={"Authorization": auth})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200
            assert json.loads(response.read())["product_name"] == "lavinpy"
        with urllib.request.urlopen(f"http://127.0.0.1:{ports['prometheus']}/metrics", timeout=30) as response:
            assert b"lavinpy_identity_info" in response.read()
        assert "aiohttp" in mapped_files(proc.pid)
    finally:
        assert stop(proc) == 0


def test_a_settings_file_still_loads_the_yaml_parser(tmp_path: Path) -> None:
    amqp = free_port()
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "lavinpy.yaml").write_text(f"amqp_port: {amqp}\n")
    proc = start(["--data-dir", str(tmp_path / "data"), "--bind", "127.0.0.1", "--http-port", "0",
                  "--prometheus-port", "0", "--mqtt-port", "0", "--amqps-port", "0", "--mqtts-port", "0"], tmp_path)
    try:
        wait_for(lambda: listening(amqp), proc, f"AMQP on {amqp} (from the settings file)")
    finally:
        assert stop(proc) == 0
