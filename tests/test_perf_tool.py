"""lavinpy-perf against a real lavinpy broker started as a subprocess, plus unit checks of its bookkeeping."""

from __future__ import annotations

import json
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

from lavinpy.cli import perf
from lavinpy.wire.uri import Tuning
from tests.helpers import free_port


@pytest.fixture
def broker_uri(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    with open(tmp_path / "lavinpy.log", "wb") as log:  # the child keeps its own copy of the fd
        proc = subprocess.Popen(
            [sys.executable, "-m", "lavinpy", "--data-dir", str(tmp_path / "data"), "--amqp-port", str(port),
             "--http-port", "0", "--prometheus-port", "0", "--mqtt-port", "0"],
            cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 15
        while True:
            if proc.poll() is not None:
                pytest.fail(f"broker exited: {(tmp_path / 'lavinpy.log').read_text()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("broker did not start listening")
                time.sleep(0.05)
        yield f"amqp://guest:guest@127.0.0.1:{port}/"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_perf(*args: str, timeout: float = 30) -> dict:
    res = subprocess.run([sys.executable, "-m", "lavinpy.cli.perf", "--json-only", *args],
                         capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1, res.stdout  # stdout carries the JSON summary and nothing else
    summary = json.loads(lines[0])
    summary["stderr"] = res.stderr
    return summary


def queue_exists(uri: str, name: str) -> bool:
    conn = pika.BlockingConnection(pika.URLParameters(uri))
    try:
        conn.channel().queue_declare(name, passive=True)
        return True
    except pika.exceptions.ChannelClosedByBroker:
        return False
    finally:
        if conn.is_open:
            conn.close()


def test_confirmed_publish_and_drain(broker_uri: str) -> None:
    r = run_perf("--uri", broker_uri, "-x", "1", "-y", "1", "-z", "2", "-c", "64", "-q", "100", "-s", "64",
                 "--drain")
    assert r["published"] > 0
    assert r["drained"] is True
    assert r["consumed"] == r["published"]
    assert r["confirmed"] == r["published"]
    assert r["nacked"] == 0
    assert r["pub_rate"] > 0 and r["con_rate"] > 0
    for key in ("latency_p50_us", "latency_p95_us", "latency_p99_us"):
        assert r[key] > 0
    assert r["latency_p50_us"] <= r["latency_p95_us"] <= r["latency_p99_us"]
    assert r["latency_samples"] > 0
    assert r["duration"] == pytest.approx(2, abs=0.2)
    # a run of 2 s or more says how far it got on stderr: a line per 10 % when it is not a terminal
    progress = [line for line in r["stderr"].splitlines() if line.startswith("lavinpy-perf: measuring: ")]
    percents = [int(line.split()[2].rstrip("%")) for line in progress]
    assert percents == sorted(set(percents)) and percents[-1] == 100 and len(percents) >= 5, r["stderr"]
    assert r["params"]["confirm"] == 64 and r["params"]["multi_ack"] == 50
    assert "guest:guest" not in r["params"]["uri"]
    assert not queue_exists(broker_uri, "perf-test")


def test_several_queues_autoack_rate_and_keep(broker_uri: str) -> None:
    # One consumer for two queues: it must subscribe to both for the drain to finish.
    r = run_perf("--uri", broker_uri, "-x", "2", "-y", "1", "--queues", "2", "--queue", "pt", "-z", "1", "-a",
                 "--persistent", "-r", "500", "--drain", "--keep-queue")
    # Two publishers at 500 msg/s each for one second.
    assert 600 <= r["published"] <= 1100
    assert r["consumed"] == r["published"]
    assert r["confirmed"] == 0
    assert queue_exists(broker_uri, "pt-1") and queue_exists(broker_uri, "pt-2")


def test_confirm_accounting_mixes_single_and_multiple() -> None:
    c = perf.Client.__new__(perf.Client)  # only the bookkeeping fields are needed
    c.confirmed = c.nacked = c._acked_upto = 0
    c._singles = set()
    c._confirm_wakeup = None
    c._on_confirm(2, 0, False)
    c._on_confirm(5, 0, True)
    c._on_confirm(2, 0, False)  # duplicate: ignored
    c._on_confirm(4, 1, False)  # covers 1, 3, 4 (2 already counted)
    c._on_confirm(3, 0, False)  # already covered
    c._on_confirm(6, 1, False)  # covers 6 (5 already counted)
    assert (c.confirmed, c.nacked, c._acked_upto, c._singles) == (6, 1, 6, set())


def test_message_template_and_helpers() -> None:
    tmpl, ts_off = perf.message_template("q", 300_000, True, 131072)
    frames = []
    pos = 0
    while pos < len(tmpl):
        ftype, _, size = struct.unpack_from(">BHI", tmpl, pos)
        assert tmpl[pos + 7 + size] == 0xCE
        frames.append((ftype, size))
        pos += 8 + size
    assert [f[0] for f in frames] == [1, 2, 3, 3, 3]
    assert sum(size for t, size in frames if t == 3) == 300_000
    assert max(size for _, size in frames) <= 131072 - 8
    assert ts_off == 8 + frames[0][1] + 8 + frames[1][1] + 7
    assert perf.message_template("q", 4, False, 131072)[1] == -1

    assert perf.parse_uri("amqp://u:p%40w@h:1234/v%2Fx") == {
        "host": "h", "port": 1234, "user": "u", "password": "p@w", "vhost": "v/x", "tls": None, "tuning": Tuning()}
    tuned = perf.parse_uri("amqp://h/?heartbeat=5&connection_timeout=2500&channel_max=9&frame_max=8192")["tuning"]
    assert (tuned.heartbeat, tuned.connection_timeout, tuned.channel_max, tuned.frame_max) == (5, 2.5, 9, 8192)
    assert perf.parse_uri("amqp://h")["vhost"] == "/"
    tls = perf.parse_uri("amqps://h/?cacertfile=/ca.pem&verify=verify_peer")
    assert (tls["port"], tls["tls"].cacertfile, tls["tls"].verify) == (5671, "/ca.pem", True)
    with pytest.raises(ValueError, match="verify_peer or verify_none"):
        perf.parse_uri("amqps://h/?verify=maybe")
    assert perf.percentile(list(range(1, 101)), 99) == 99
    assert perf.percentile([7], 50) == 7
