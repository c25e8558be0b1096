"""Side-by-side comparison of lavinpy and RabbitMQ with amqpperf (see bench/README.md).

Starts both brokers on loopback with fresh data directories, runs each scenario against each
broker, alternating brokers, ``--rounds`` times, prints one table (figure for both brokers and the
ratio lavinpy / RabbitMQ, best of the rounds) and writes all raw results as JSON. Both brokers are
stopped by PID at the end. Run it through bench/compare.sh, which installs what it needs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

SCENARIOS: dict[str, list[str]] = {
    "a": ["-size", "16", "-autoack", "-warmup", "2", "-duration", "10"],
    "b": ["-size", "1024", "-persistent", "-confirm", "256", "-prefetch", "256", "-warmup", "2", "-duration", "10"],
    "c": ["-mode", "fill-drain", "-count", "1000000", "-size", "16", "-persistent", "-confirm", "1000",
          "-prefetch", "1000"],
    "d": ["-publishers", "100", "-consumers", "100", "-queues", "100", "-size", "16", "-confirm", "64",
          "-autoack", "-warmup", "2", "-duration", "10"],
}
E_COUNT = 10_000_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"nothing listens on port {port} after {timeout} s")


def rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


@dataclass
class Broker:
    name: str
    workdir: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    log: Path | None = None

    @property
    def uri(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    @property
    def pids(self) -> list[int]:
        """The broker's own process(es): RabbitMQ runs in beam.smp under its start script."""
        assert self.proc is not None
        pids = [self.proc.pid]
        try:
            out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout
            pids += [int(p) for p in out.split()]
        except OSError:
            pass
        return pids

    def start(self) -> None:
        raise NotImplementedError

    def _open_log(self):  # noqa: ANN202 - kept open for the broker's lifetime, closed by the OS at exit
        assert self.log is not None
        return self.log.open("ab")  # noqa: SIM115

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        for pid in reversed(self.pids):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            for pid in self.pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.proc.wait(10)


class Lavinpy(Broker):
    def start(self) -> None:
        data = self.workdir / "lavinpy-data"
        data.mkdir(parents=True, exist_ok=True)
        self.log = self.workdir / "lavinpy.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lavinpy", "--data-dir", str(data), "--amqp-port", str(self.port),
             "--http-port", "0", "--bind", "127.0.0.1", "--log-level", "warning"],
            cwd=self.workdir, stdout=subprocess.DEVNULL, stderr=self._open_log())
        wait_port(self.port, self.proc)


class RabbitMQ(Broker):
    """A private RabbitMQ node: its own name, ports, data and cookie; no plugins; loopback only."""

    def start(self) -> None:
        base = self.workdir / "rabbitmq"
        base.mkdir(parents=True, exist_ok=True)
        (base / "enabled_plugins").write_text("[].\n")
        self.log = base / "console.log"
        dist = free_port()
        env = dict(os.environ,
                   HOME=str(base),
                   RABBITMQ_NODENAME=f"lpbench{self.port}@localhost",
                   RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
                   RABBITMQ_NODE_PORT=str(self.port),
                   RABBITMQ_DIST_PORT=str(dist),
                   ERL_EPMD_ADDRESS="127.0.0.1",
                   RABBITMQ_MNESIA_BASE=str(base / "mnesia"),
                   RABBITMQ_LOG_BASE=str(base / "log"),
                   RABBITMQ_ENABLED_PLUGINS_FILE=str(base / "enabled_plugins"),
                   RABBITMQ_CONFIG_FILE=str(base / "rabbitmq"))
        # The distribution's script runs the server in the foreground as the current user.
        script = "/usr/lib/rabbitmq/bin/rabbitmq-server"
        self.proc = subprocess.Popen([script], env=env, cwd=base, stdout=self._open_log(),
                                     stderr=subprocess.STDOUT, start_new_session=True)
        wait_port(self.port, self.proc, timeout=180)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def run_amqpperf(amqpperf: str, broker: Broker, args: list[str]) -> dict:
    pids = ",".join(str(p) for p in broker.pids)
    cmd = [amqpperf, "-uri", broker.uri, "-broker-pid", pids, "-label", broker.name, *args]
    out = subprocess.run(cmd, capture_output=True, text=True)
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"errors": [f"amqpperf exit {out.returncode}: {out.stderr.strip()[-500:]}"]}


def queue_message_count(broker: Broker, queue: str) -> int:
    import pika  # test dependency; only scenario e needs it

    conn = pika.BlockingConnection(pika.URLParameters(broker.uri))
    try:
        return conn.channel().queue_declare(queue, passive=True, durable=True).method.message_count
    finally:
        conn.close()


def scenario_e(amqpperf: str, broker: Broker, count: int, fill_timeout: float = 1800.0) -> dict:
    """Fill ``count`` × 16 B persistent, restart the broker, time until the queue serves again.

    A broker that cannot take ``count`` messages within ``fill_timeout`` (RabbitMQ's memory alarm
    stops publishers long before 10M on a small machine) is restarted with what it holds.
    """
    queue = "compare-e"
    started = time.monotonic()
    filled = 0
    while filled < count and time.monotonic() - started < fill_timeout:
        res = run_amqpperf(amqpperf, broker, [
            "-queue", queue, "-publishers", "1", "-consumers", "0", "-size", "16", "-persistent",
            "-confirm", "1000", "-duration", "10", "-keep-queue", "-purge=false"])
        if res.get("errors"):
            return {"errors": res["errors"]}
        filled = queue_message_count(broker, queue)
    fill_s = time.monotonic() - started
    rss_full = max(rss_kb(p) for p in broker.pids)
    broker.stop()
    t0 = time.monotonic()
    broker.start()
    # served again = the first message of the queue can be fetched
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(broker.uri))
    ch = conn.channel()
    while True:
        method, _props, _body = ch.basic_get(queue)
        if method is not None:
            break
        time.sleep(0.05)
    served_s = time.monotonic() - t0
    remaining = ch.queue_declare(queue, passive=True, durable=True).method.message_count + 1
    ch.queue_delete(queue)
    conn.close()
    rss_after = max(rss_kb(p) for p in broker.pids)
    return {"filled": filled, "fill_s": round(fill_s, 1), "served_again_s": round(served_s, 2),
            "recovered": remaining, "broker_rss_full_kb": rss_full, "broker_rss_after_restart_kb": rss_after}


def figures(scenario: str, r: dict) -> dict[str, float]:
    """The figures of one result that go into the table."""
    if r.get("errors"):
        return {}
    if scenario == "c":
        return {"fill msg/s": r.get("fill_rate", 0), "drain msg/s": r.get("drain_rate", 0),
                "RSS peak MiB": (r.get("broker_rss_peak_kb") or r.get("broker_rss_kb") or 0) / 1024}
    if scenario == "e":
        return {"messages": r["filled"], "fill s": r["fill_s"],
                "served again s": r["served_again_s"], "RSS full MiB": r["broker_rss_full_kb"] / 1024,
                "RSS after restart MiB": r["broker_rss_after_restart_kb"] / 1024}
    out = {"pub msg/s": r.get("pub_rate", 0), "con msg/s": r.get("con_rate", 0)}
    lat = r.get("latency_us") or {}
    if "p99" in lat:
        out["p99 latency ms"] = lat["p99"] / 1000
    if scenario == "d":
        for key, label in (("per_queue_con_rate", "queues"), ("per_pub_rate", "publishers")):
            jain = (r.get(key) or {}).get("jain")
            if isinstance(jain, (int, float)):
                out[f"Jain fairness {label}"] = jain
    out["RSS peak MiB"] = (r.get("broker_rss_peak_kb") or 0) / 1024
    return out


LOWER_IS_BETTER = ("latency", "RSS", "served again", "fill s")


def best(scenario: str, results: list[dict]) -> dict[str, float]:
    merged: dict[str, float] = {}
    for r in results:
        for k, v in figures(scenario, r).items():
            lower = any(word in k for word in LOWER_IS_BETTER)
            if k not in merged or (v < merged[k] if lower else v > merged[k]):
                merged[k] = v
    return merged


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--amqpperf", required=True)
    ap.add_argument("--scenarios", default="a,b,c,d,e")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--e-count", type=int, default=E_COUNT)
    ap.add_argument("--e-fill-timeout", type=float, default=1800.0)
    ap.add_argument("--brokers", default="lavinpy,rabbitmq", help="which brokers to run")
    ap.add_argument("--out", default="bench/out/compare.json")
    args = ap.parse_args(argv)
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    work = Path(tempfile.mkdtemp(prefix="lavinpy-compare-"))
    wanted = set(args.brokers.split(","))
    brokers = [b for b in (Lavinpy("lavinpy", work / "l"), RabbitMQ("rabbitmq", work / "r")) if b.name in wanted]
    results: dict[str, dict[str, list[dict]]] = {s: {b.name: [] for b in brokers} for s in scenarios}
    try:
        for b in brokers:
            b.workdir.mkdir(parents=True)
            b.start()
            print(f"{b.name} on port {b.port} (pids {b.pids})", file=sys.stderr)
        for scenario in scenarios:
            for rnd in range(args.rounds):
                for b in brokers:
                    print(f"scenario {scenario} round {rnd + 1}: {b.name}", file=sys.stderr, flush=True)
                    if scenario == "e":
                        r = scenario_e(args.amqpperf, b, args.e_count, args.e_fill_timeout)
                    else:
                        r = run_amqpperf(args.amqpperf, b, SCENARIOS[scenario])
                    results[scenario][b.name].append(r)
                    if r.get("errors"):
                        print(f"  errors: {r['errors']}", file=sys.stderr)
    finally:
        for b in brokers:
            b.stop()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"\n{'scenario':<9}{'figure':<26}{'lavinpy':>14}{'RabbitMQ':>14}{'ratio':>9}")
    for scenario in scenarios:
        lp = best(scenario, results[scenario].get("lavinpy", []))
        rq = best(scenario, results[scenario].get("rabbitmq", []))
        for key in sorted(set(lp) | set(rq), key=lambda k: list(lp).index(k) if k in lp else 99):
            a, b = lp.get(key), rq.get(key)
            ratio = f"{a / b:.2f}" if a is not None and b else "-"
            fa = f"{a:,.1f}" if a is not None else "-"
            fb = f"{b:,.1f}" if b is not None else "-"
            print(f"{scenario:<9}{key:<26}{fa:>14}{fb:>14}{ratio:>9}")
    print(f"\nraw results: {args.out}; broker logs under {work}")
    shutil.rmtree(work / "l" / "lavinpy-data", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
