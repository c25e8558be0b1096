"""What the management API, the metrics and the message counters cost the broker.

1. N queues (default 10,000) of every kind: classic transient and durable, priority, lazy and with
   arguments (TTL, max-length, dead-letter exchange), quorum, stream, exclusive, auto-delete; some
   under a policy, some with consumers, one in ten holding messages, some with unacked deliveries.
   Then five runs each (median and max) of ``/api/queues`` (whole and one page), ``/api/overview``,
   ``/api/exchanges``, ``/api/connections``, and on the Prometheus port ``/metrics`` and
   ``/metrics/detailed`` with every family, each with the default prefix and ``?prefix=rabbitmq``.
2. An AMQP consumer's delivery latency (a message every 10 ms) for ``--seconds`` without HTTP
   traffic, then as long again while another process polls ``/api/queues`` every second.
3. With ``--perf-baseline REPO``: broker CPU per message at a fixed rate (``--rate``, 16 B
   transient, autoack, one publisher and one consumer, ``--perf-queues`` idle queues for the
   sampler to walk), this tree against REPO (a copy without the counters and samples), runs
   alternated (bench/counters_off.py makes that baseline). The load comes from amqpperf at
   ``-rate`` (``--amqpperf``, default bench/out/amqpperf; the broker's CPU read from /proc over
   the middle of its measured window), else from lavinpy-perf ``-r`` (CPU over the whole run).

Starts its own brokers (free ports, temporary data dirs, fsync never); prints a table, then one
JSON object on the last line. Targets: ``/api/queues`` and ``/metrics`` < 300 ms, latency p99 growth < 50 ms,
counters and samples < 3 % broker CPU per message.

    python bench/http_cost.py [--queues 10000] [--seconds 10] [--perf-baseline /path/to/old/checkout]
"""

from __future__ import annotations

import argparse
import base64
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pika  # type: ignore[import-untyped]
from bench_broker import BrokerProcess

REPO = Path(__file__).resolve().parents[1]
DEFAULT_AMQPPERF = REPO / "bench" / "out" / "amqpperf"
# The per-object families of /metrics/detailed (lavinpy.http.metrics.DETAILED_FAMILIES).
DETAILED_FAMILIES = ("queue_coarse_metrics", "queue_consumer_count", "queue_metrics", "queue_delivery_metrics",
                     "queue_publish_metrics", "exchange_metrics", "vhost_status")


class Broker(BrokerProcess):
    """With the HTTP ports (unless ``http`` is False), and half a second to settle once listening."""

    def __init__(self, repo: Path, workdir: Path, http: bool = True) -> None:
        super().__init__(workdir, repo=repo, http=http, start_timeout=30)
        time.sleep(0.5)

    @property
    def plain_url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/"

    @property
    def url(self) -> str:
        """For pika: no heartbeats, as the connection holding the consumers sits idle while timing."""
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/%2F?heartbeat=0"


def request(url: str, method: str = "GET", body: dict | None = None) -> bytes:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    if data is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=120) as response:
        return response.read()


def time_get(url: str, runs: int) -> dict:
    times = []
    size = 0
    for _ in range(runs):
        start = time.perf_counter()
        body = request(url)
        times.append((time.perf_counter() - start) * 1000)
        size = len(body)
    return {"median_ms": round(statistics.median(times), 1), "max_ms": round(max(times), 1), "bytes": size}


# The issue's targets: these lists and scrapes under 300 ms (the others are timed for the record).
TARGETS = ("/api/queues", "/metrics")
# One hundred queues in each round of the mix: (how many, kind). Names say the kind.
MIX = ((28, "classic"), (18, "durable"), (5, "priority"), (5, "lazy-args"), (10, "quorum"), (8, "stream"),
       (8, "exclusive"), (8, "auto-delete"), (10, "policy"))
QUEUE_ARGUMENTS = {
    "priority": {"x-max-priority": 10},
    "lazy-args": {"x-queue-mode": "lazy", "x-message-ttl": 3_600_000, "x-max-length": 100_000,
                  "x-dead-letter-exchange": "amq.fanout"},
    "quorum": {"x-queue-type": "quorum"},
    "stream": {"x-queue-type": "stream"},
}
POLICY = {"pattern": "^bench-policy-", "apply-to": "queues",
          "definition": {"max-length": 1_000_000, "message-ttl": 3_600_000}}


def mix_kinds(count: int) -> list[str]:
    """The kinds interleaved by their shares (every kind within the first dozen queues)."""
    order = [kind for _, kind in sorted(((i + 0.5) / share, kind) for share, kind in MIX for i in range(share))]
    return [order[n % len(order)] for n in range(count)]


class QueueMix:
    """Declares the queues and keeps the connection that holds the exclusive ones and the consumers
    open while the API is timed (closing it would delete them)."""

    def __init__(self, broker: Broker, count: int) -> None:
        self.conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        self.kinds: dict[str, int] = {}
        self.consumers = self.unacked = self.with_messages = 0
        if broker.http_port:
            request(f"http://127.0.0.1:{broker.http_port}/api/policies/%2F/bench-policy", "PUT", POLICY)
        ch = self.conn.channel()
        consume_ch = self.conn.channel()
        consume_ch.basic_qos(prefetch_count=3)  # manual ack, never given: up to three unacked each
        for n, kind in enumerate(mix_kinds(count)):
            name = f"bench-{kind}-{n:05d}"
            ch.queue_declare(name, durable=kind in ("durable", "priority", "quorum", "stream", "policy"),
                             exclusive=kind == "exclusive", auto_delete=kind == "auto-delete",
                             arguments=QUEUE_ARGUMENTS.get(kind))
            i = self.kinds[kind] = self.kinds.get(kind, 0) + 1  # each kind gets each case below
            stream = kind == "stream"
            if i % 10 in (1, 4):  # one message in one queue of ten, five in one of twenty
                for _ in range(5 if i % 20 == 4 else 1):
                    ch.basic_publish("", name, b"x" * 64)
                self.with_messages += 1
            if i % 20 == 4:  # a consumer that takes up to three of the five and never acks
                consume_ch.basic_consume(name, lambda *a: None, auto_ack=False,
                                         arguments={"x-stream-offset": "first"} if stream else None)
                self.consumers += 1
                self.unacked += 1
            elif i % 20 == 14:  # an idle consumer on an empty queue
                consume_ch.basic_consume(name, lambda *a: None, auto_ack=not stream,
                                         arguments={"x-stream-offset": "next"} if stream else None)
                self.consumers += 1
        self.conn.process_data_events(time_limit=0.5)

    def describe(self) -> dict:
        return {"kinds": self.kinds, "consumers": self.consumers, "queues_with_messages": self.with_messages,
                "queues_with_unacked": self.unacked}

    def close(self) -> None:
        self.conn.close()


def time_endpoints(broker: Broker, runs: int) -> dict[str, dict]:
    api = f"http://127.0.0.1:{broker.http_port}"
    paths = {f"{api}{p}": p for p in ("/api/queues", "/api/queues?page=1&page_size=100", "/api/overview",
                                       "/api/exchanges", "/api/connections")}
    if broker.prometheus_port:
        families = "&".join(f"family={f}" for f in DETAILED_FAMILIES)
        metrics = f"http://127.0.0.1:{broker.prometheus_port}"
        for path in ("/metrics", "/metrics?prefix=rabbitmq", f"/metrics/detailed?{families}",
                     f"/metrics/detailed?{families}&prefix=rabbitmq"):
            paths[metrics + path] = path.replace(families, "family=<all>")
    return {label: time_get(url, runs) for url, label in paths.items()}


def _poll(http_url: str, stop_at: float, out: multiprocessing.Queue) -> None:
    times = []
    while time.monotonic() < stop_at:
        start = time.perf_counter()
        request(http_url + "/api/queues")
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


def declare_idle_queues(url: str, count: int) -> None:
    """Plain classic queues (any checkout has them), one in ten holding a message: the sampler's walk."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    for n in range(count):
        ch.queue_declare(f"idle-{n:05d}")
        if n % 10 == 0:
            ch.basic_publish("", f"idle-{n:05d}", b"x")
    conn.close()


def perf_cpu_per_message(repo: Path, workdir: Path, args: argparse.Namespace) -> dict:
    """Broker CPU µs per message at a fixed rate: 16 B transient, one publisher, one consumer, autoack."""
    broker = Broker(repo, workdir)
    try:
        declare_idle_queues(broker.url, args.perf_queues)
        if args.amqpperf:
            # The broker's CPU read here, over the middle of amqpperf's measured window (its own
            # figure is rounded to 0.01 core: 3 % of the CPU at 100k msg/s).
            with tempfile.TemporaryFile("w+") as out:
                perf = subprocess.Popen([args.amqpperf, "-uri", broker.plain_url, "-size", "16", "-autoack", "-rate",
                                         str(args.rate), "-warmup", "2", "-duration", str(args.perf_seconds)],
                                        stdout=out, stderr=subprocess.STDOUT, text=True)
                time.sleep(2.5)
                cpu0, t0 = broker.cpu_seconds(), time.monotonic()
                time.sleep(args.perf_seconds - 1)
                cpu1, t1 = broker.cpu_seconds(), time.monotonic()
                perf.wait(args.perf_seconds + 120)
                out.seek(0)
                output = out.read()
            try:
                rate = json.loads(output.strip().splitlines()[-1]).get("con_rate")
            except (IndexError, json.JSONDecodeError):
                rate = None
            if not rate:
                raise SystemExit(f"amqpperf gave no rate: {output[-800:]}")
            cores = (cpu1 - cpu0) / (t1 - t0)
            return {"us_per_msg": cores * 1e6 / rate, "msg_per_s": rate, "broker_cores": cores}
        cpu_before = broker.cpu_seconds()
        done = subprocess.run([sys.executable, "-m", "lavinpy.cli.perf", "--uri", broker.plain_url, "-s", "16",
                               "-r", str(args.rate), "-z", str(args.perf_seconds), "--json-only"],
                              env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                              timeout=args.perf_seconds + 120)
        cpu = broker.cpu_seconds() - cpu_before
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        received = summary.get("consumed_total")
        if not received:
            raise SystemExit(f"lavinpy-perf gave no count: {done.stdout[-500:]} {done.stderr[-500:]}")
        return {"us_per_msg": cpu / received * 1e6, "msg_per_s": received / args.perf_seconds,
                "broker_cores": cpu / args.perf_seconds}
    finally:
        broker.stop()


def cost_run(args: argparse.Namespace) -> dict:
    result: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        broker = Broker(REPO, Path(tmp))
        http_url = f"http://127.0.0.1:{broker.http_port}"
        mix = None
        try:
            start = time.perf_counter()
            mix = QueueMix(broker, args.queues)
            result["declare_s"] = round(time.perf_counter() - start, 1)
            result["mix"] = mix.describe()
            time.sleep(args.settle)  # a sample or two over the whole mix (the sampler runs every 5 s)
            overview = json.loads(request(http_url + "/api/overview"))
            result["broker_saw"] = {**overview.get("object_totals", {}),
                                    **{k: v for k, v in overview.get("queue_totals", {}).items() if "details" not in k}}
            result["endpoints"] = time_endpoints(broker, args.runs)
            result["latency_idle"] = latency_run(broker.url, args.seconds)
            results: multiprocessing.Queue = multiprocessing.Queue()
            poller = multiprocessing.Process(target=_poll, args=(http_url, time.monotonic() + args.seconds, results))
            poller.start()
            result["latency_polled"] = latency_run(broker.url, args.seconds)
            poll_times = results.get(timeout=300)
            poller.join()
            result["polls"] = {"count": len(poll_times), "median_ms": round(statistics.median(poll_times), 1)}
            for figure in ("p99_ms", "max_ms"):
                result[f"latency_{figure.split('_')[0]}_growth_ms"] = round(
                    result["latency_polled"][figure] - result["latency_idle"][figure], 2)
            result["broker_alive"] = broker.proc.poll() is None
        finally:
            if mix is not None:
                mix.close()
            broker.stop()
    return result


def cpu_comparison(args: argparse.Namespace) -> dict:
    rounds: dict[str, list[dict]] = {"baseline": [], "this": []}
    for _ in range(args.perf_rounds):
        for label, repo in (("baseline", args.perf_baseline), ("this", REPO)):
            with tempfile.TemporaryDirectory() as tmp:
                rounds[label].append(perf_cpu_per_message(repo, Path(tmp), args))
            run = rounds[label][-1]
            print(f"{label}: {run['us_per_msg']:.2f} µs broker CPU per message at {run['msg_per_s']:,.0f} msg/s",
                  file=sys.stderr)
    def change(pick) -> float:  # noqa: ANN001 - min or statistics.median
        base = pick([r["us_per_msg"] for r in rounds["baseline"]])
        return round((pick([r["us_per_msg"] for r in rounds["this"]]) - base) / base * 100, 1)

    return {"rate": args.rate, "tool": "amqpperf" if args.amqpperf else "lavinpy-perf", "idle_queues": args.perf_queues,
            **{label: [{k: round(v, 3) for k, v in r.items()} for r in runs] for label, runs in rounds.items()},
            "change_pct_best_of": change(min), "change_pct_median": change(statistics.median)}


def print_table(result: dict) -> None:
    print(f"\n{result['queues']:,} queues: {result['mix']['kinds']}, {result['mix']['consumers']} consumers; "
          f"declared in {result['declare_s']} s\nthe broker's overview: {result['broker_saw']}")
    print(f"{'GET':<52}{'median ms':>11}{'max ms':>9}{'bytes':>12}{'< 300 ms':>10}")
    for path, t in result["endpoints"].items():
        verdict = ("yes" if t["max_ms"] < 300 else "NO") if path.split("?")[0] in TARGETS else ""
        print(f"{path:<52}{t['median_ms']:>11,.1f}{t['max_ms']:>9,.1f}{t['bytes']:>12,}{verdict:>10}")
    idle, polled = result["latency_idle"], result["latency_polled"]
    print(f"delivery latency p99 / max: idle {idle['p99_ms']} / {idle['max_ms']} ms, /api/queues polled every "
          f"second {polled['p99_ms']} / {polled['max_ms']} ms (p99 growth {result['latency_p99_growth_ms']} ms, "
          "target < 50)")
    cpu = result.get("cpu_us_per_msg")
    if cpu:
        print(f"broker CPU per message at {cpu['rate']:,} msg/s ({cpu['tool']}), baseline / this: "
              f"{', '.join(str(r['us_per_msg']) for r in cpu['baseline'])} / "
              f"{', '.join(str(r['us_per_msg']) for r in cpu['this'])} µs "
              f"(best of each: {cpu['change_pct_best_of']:+.1f} %, medians: {cpu['change_pct_median']:+.1f} %, "
              "target < 3 %)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5, help="timed requests per endpoint")
    parser.add_argument("--seconds", type=float, default=10.0, help="each latency run")
    parser.add_argument("--settle", type=float, default=6.0, help="seconds between declaring and timing")
    parser.add_argument("--perf-baseline", type=Path, help="a checkout to compare broker CPU per message with")
    parser.add_argument("--rate", type=int, default=100_000, help="the CPU comparison's fixed rate, msg/s")
    parser.add_argument("--perf-queues", type=int, help="idle queues during the CPU runs (default: --queues)")
    parser.add_argument("--amqpperf", default=str(DEFAULT_AMQPPERF) if os.access(DEFAULT_AMQPPERF, os.X_OK) else "",
                        help="amqpperf binary for the CPU runs; empty: lavinpy-perf")
    parser.add_argument("--perf-seconds", type=int, default=10)
    parser.add_argument("--perf-rounds", type=int, default=3)
    args = parser.parse_args()
    if args.perf_queues is None:
        args.perf_queues = args.queues
    result: dict = {"python": sys.version.split()[0], "queues": args.queues, **cost_run(args)}
    if args.perf_baseline:
        result["cpu_us_per_msg"] = cpu_comparison(args)
    print_table(result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
