"""What the management API costs the broker.

1. ``/api/queues`` with N queues (default 10,000): time of the full list and of one page.
2. An AMQP consumer's delivery latency (a message every 10 ms) for ``--seconds`` without HTTP
   traffic, then as long again while another process polls ``/api/queues`` every second.
3. With ``--perf-baseline REPO``: broker CPU per message of a 16 B transient lavinpy-perf run, this
   tree against REPO (e.g. a checkout from before the message counters), runs alternated.

Starts its own brokers (free ports, temporary data dirs); prints one JSON object at the end.
Targets: list < 300 ms, latency p99 growth < 50 ms, counters < 3 % CPU per message.

    python bench/http_cost.py [--queues 10000] [--seconds 10] [--perf-baseline /path/to/old/checkout]
"""

from __future__ import annotations

import argparse
import base64
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pika

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Broker:
    def __init__(self, repo: Path, workdir: Path, http: bool = True) -> None:
        self.amqp_port = free_port()
        self.http_port = free_port() if http else 0
        env = {k: v for k, v in os.environ.items() if not k.startswith("LAVINPY_")}
        env["PYTHONPATH"] = str(repo)
        cmd = [sys.executable, "-m", "lavinpy", "--data-dir", str(workdir / "data"), "--amqp-port",
               str(self.amqp_port), "--http-port", str(self.http_port), "--log-level", "warning", "--fsync", "never"]
        if "prometheus_port" in (repo / "lavinpy" / "config.py").read_text():
            cmd += ["--prometheus-port", "0"]
        self.log = open(workdir / "broker.log", "ab")  # noqa: SIM115 - open while the broker runs
        self.proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not self._listening():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"broker did not start: see {workdir / 'broker.log'}")
            time.sleep(0.1)
        time.sleep(0.5)

    def _listening(self) -> bool:
        ports = [self.amqp_port] + ([self.http_port] if self.http_port else [])
        for port in ports:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            except OSError:
                return False
        return True

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/"

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


def get(url: str) -> bytes:
    request = urllib.request.Request(url)
    request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.read()


def time_list(http_url: str, path: str, runs: int) -> dict:
    times = []
    size = 0
    for _ in range(runs):
        start = time.perf_counter()
        body = get(http_url + path)
        times.append((time.perf_counter() - start) * 1000)
        size = len(body)
    return {"median_ms": round(statistics.median(times), 1), "max_ms": round(max(times), 1), "bytes": size}


def declare_queues(url: str, count: int) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    for n in range(count):
        ch.queue_declare(f"bench-{n:05d}")
        if n % 10 == 0:
            ch.basic_publish("", f"bench-{n:05d}", b"x")
    conn.close()


def _poll(http_url: str, stop_at: float, out: multiprocessing.Queue) -> None:
    times = []
    while time.monotonic() < stop_at:
        start = time.perf_counter()
        get(http_url + "/api/queues")
        times.append((time.perf_counter() - start) * 1000)
        time.sleep(max(0.0, 1.0 - (time.perf_counter() - start)))
    out.put(times)


def latency_run(url: str, seconds: float) -> dict:
    """A publisher thread sends a stamped message every 10 ms; the consumer records receive - send."""
    queue = "bench-latency"
    consumer_conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = consumer_conn.channel()
    ch.queue_declare(queue)
    ch.queue_purge(queue)
    latencies: list[float] = []
    stop = threading.Event()

    def publish() -> None:
        conn = pika.BlockingConnection(pika.URLParameters(url))
        pch = conn.channel()
        while not stop.is_set():
            pch.basic_publish("", queue, str(time.monotonic()).encode())
            conn.process_data_events(time_limit=0.01)
        conn.close()

    def on_message(channel, method, properties, body) -> None:
        latencies.append((time.monotonic() - float(body)) * 1000)

    ch.basic_consume(queue, on_message, auto_ack=True)
    publisher = threading.Thread(target=publish)
    publisher.start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        consumer_conn.process_data_events(time_limit=0.1)
    stop.set()
    publisher.join()
    consumer_conn.close()
    latencies.sort()
    return {"messages": len(latencies), "p50_ms": round(latencies[len(latencies) // 2], 2),
            "p99_ms": round(latencies[int(len(latencies) * 0.99)], 2), "max_ms": round(latencies[-1], 2)}


def perf_cpu_per_message(repo: Path, workdir: Path, seconds: int) -> float:
    """Broker CPU µs per message: one publisher and one consumer, 16 B transient, no confirms."""
    broker = Broker(repo, workdir, http=False)
    try:
        cpu_before = broker.cpu_seconds()
        done = subprocess.run([sys.executable, "-m", "lavinpy.cli.perf", "--uri", broker.url, "-s", "16",
                               "-z", str(seconds), "--json-only"], env={**os.environ, "PYTHONPATH": str(REPO)},
                              capture_output=True, text=True, timeout=seconds + 120)
        cpu = broker.cpu_seconds() - cpu_before
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        received = summary.get("consumed_total")
        if not received:
            raise SystemExit(f"lavinpy-perf gave no count: {done.stdout[-500:]} {done.stderr[-500:]}")
        return cpu / received * 1e6
    finally:
        broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--perf-baseline", type=Path, help="a checkout to compare broker CPU per message with")
    parser.add_argument("--perf-seconds", type=int, default=10)
    parser.add_argument("--perf-rounds", type=int, default=2)
    args = parser.parse_args()
    result: dict = {"python": sys.version.split()[0], "queues": args.queues}
    with tempfile.TemporaryDirectory() as tmp:
        broker = Broker(REPO, Path(tmp))
        http_url = f"http://127.0.0.1:{broker.http_port}"
        try:
            start = time.perf_counter()
            declare_queues(broker.url, args.queues)
            result["declare_s"] = round(time.perf_counter() - start, 1)
            result["api_queues_full"] = time_list(http_url, "/api/queues", 5)
            result["api_queues_page"] = time_list(http_url, "/api/queues?page=1&page_size=100", 5)
            result["latency_idle"] = latency_run(broker.url, args.seconds)
            results: multiprocessing.Queue = multiprocessing.Queue()
            poller = multiprocessing.Process(target=_poll, args=(http_url, time.monotonic() + args.seconds, results))
            poller.start()
            result["latency_polled"] = latency_run(broker.url, args.seconds)
            poll_times = results.get(timeout=120)
            poller.join()
            result["polls"] = {"count": len(poll_times), "median_ms": round(statistics.median(poll_times), 1)}
            result["latency_p99_growth_ms"] = round(result["latency_polled"]["p99_ms"]
                                                    - result["latency_idle"]["p99_ms"], 2)
            result["latency_max_growth_ms"] = round(result["latency_polled"]["max_ms"]
                                                    - result["latency_idle"]["max_ms"], 2)
        finally:
            broker.stop()
    if args.perf_baseline:
        rounds: dict[str, list[float]] = {"baseline": [], "this": []}
        for _ in range(args.perf_rounds):
            for label, repo in (("baseline", args.perf_baseline), ("this", REPO)):
                with tempfile.TemporaryDirectory() as tmp:
                    rounds[label].append(perf_cpu_per_message(repo, Path(tmp), args.perf_seconds))
                    print(f"{label}: {rounds[label][-1]:.2f} µs broker CPU per message", file=sys.stderr)
        base, this = min(rounds["baseline"]), min(rounds["this"])
        result["cpu_us_per_msg"] = {"baseline": [round(v, 2) for v in rounds["baseline"]],
                                    "this": [round(v, 2) for v in rounds["this"]],
                                    "change_pct_best_of": round((this - base) / base * 100, 1)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
