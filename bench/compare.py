"""Side-by-side comparison of lavinpy, LavinMQ 1.0.0 and RabbitMQ with amqpperf (see bench/README.md).

Brokers: ``lavinpy`` (fsync always, the default), ``lavinpy-never`` (fsync never, to compare with
LavinMQ 1.0.0, which confirms without fsync), ``lavinmq`` (the shared release build) and
``rabbitmq`` (a private Debian node). Each run gets a fresh broker with a fresh data directory
(started before the run, stopped by PID after it); scenarios run against the brokers alternately,
``--rounds`` times. The table shows the median of the rounds per broker and the two ratios the
speed issue tracks: lavinpy-never / LavinMQ and lavinpy / RabbitMQ. Scenario ``cpu`` loads each
broker at a fixed rate (16 B transient, autoack) and reports broker CPU per message. For lavinpy the
CPU is also split by thread (/proc/<pid>/task): the event-loop thread against the others (the socket
reader and writer threads, the second core), over the measured window. All raw results are written
as JSON. Run it through bench/compare.sh, which installs what it needs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
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
CPU_RATE = 40_000
SCENARIOS["cpu"] = ["-size", "16", "-autoack", "-rate", str(CPU_RATE), "-warmup", "2", "-duration", "10"]
E_COUNT = 10_000_000
# LavinMQ 1.0.0 from the shared tools directory beside the repository (LAVINMQ_BIN overrides it).
LAVINMQ = os.environ.get("LAVINMQ_BIN",
                         str(Path(__file__).resolve().parents[2] / "shared/tools/lavinmq/lavinmq-1.0.0"))


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
    fsync = "always"

    def start(self) -> None:
        data = self.workdir / "lavinpy-data"
        data.mkdir(parents=True, exist_ok=True)
        self.log = self.workdir / "lavinpy.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lavinpy", "--data-dir", str(data), "--amqp-port", str(self.port),
             "--http-port", "0", "--prometheus-port", "0", "--mqtt-port", "0", "--bind", "127.0.0.1",
             "--log-level", "warning",
             "--fsync", self.fsync],
            cwd=self.workdir, stdout=subprocess.DEVNULL, stderr=self._open_log())
        wait_port(self.port, self.proc)


class LavinpyNever(Lavinpy):
    fsync = "never"


class LavinMQ(Broker):
    """The shared LavinMQ 1.0.0 release build (it needs Debian's libgc1, libevent, libpcre3)."""

    def start(self) -> None:
        data = self.workdir / "lavinmq-data"
        data.mkdir(parents=True, exist_ok=True)
        self.log = self.workdir / "lavinmq.log"
        self.proc = subprocess.Popen(
            [LAVINMQ, "--data-dir", str(data), "--bind", "127.0.0.1", "--amqp-port", str(self.port),
             "--http-port", str(free_port()), "--log-level", "warn"],
            cwd=self.workdir, stdout=self._open_log(), stderr=subprocess.STDOUT)
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


def thread_cpu_ticks(pid: int) -> dict[int, int]:
    """utime + stime (clock ticks) of each live thread of a process."""
    ticks: dict[int, int] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return ticks
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended meanwhile
        ticks[int(tid)] = int(fields[11]) + int(fields[12])
    return ticks


class ThreadCpu:
    """CPU of a process's event-loop thread (the main thread) and of its other threads over a window.

    Threads are sampled every 0.2 s; a thread that ends within the window counts up to its last
    sample, one that starts within it from zero."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.first: dict[int, int] | None = None
        self.last: dict[int, int] = {}
        self.t0 = self.t1 = 0.0

    def sample(self) -> None:
        now = thread_cpu_ticks(self.pid)
        if self.first is None:
            self.first, self.t0 = now, time.monotonic()
        self.last.update(now)
        self.t1 = time.monotonic()

    def result(self) -> dict:
        if self.first is None or self.t1 <= self.t0:
            return {}
        tck = os.sysconf("SC_CLK_TCK")
        loop = (self.last.get(self.pid, 0) - self.first.get(self.pid, 0)) / tck
        other = sum(v - self.first.get(tid, 0) for tid, v in self.last.items() if tid != self.pid) / tck
        return {"seconds": round(self.t1 - self.t0, 3), "loop_thread_s": loop, "other_threads_s": other}


def run_amqpperf(amqpperf: str, broker: Broker, args: list[str]) -> dict:
    pids = ",".join(str(p) for p in broker.pids)
    cmd = [amqpperf, "-uri", broker.uri, "-broker-pid", pids, "-label", broker.name, *args]
    # Per-thread CPU over amqpperf's measured window (after its warm-up), for lavinpy (one process).
    threads = ThreadCpu(broker.pids[0]) if isinstance(broker, Lavinpy) and "-duration" in args else None
    warmup = float(args[args.index("-warmup") + 1]) if "-warmup" in args else 0.0
    duration = float(args[args.index("-duration") + 1]) if "-duration" in args else 0.0
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        started = time.monotonic()
        while proc.poll() is None:
            time.sleep(0.2)
            if threads is not None and warmup + 0.5 < time.monotonic() - started < warmup + duration + 0.5:
                threads.sample()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    try:
        result = json.loads(stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"errors": [f"amqpperf exit {proc.returncode}: {stderr.strip()[-500:]}"]}
    if threads is not None:
        result["thread_cpu"] = threads.result()
    return result


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
    cores = (r.get("cpu_cores") or {}).get("broker")
    tc = r.get("thread_cpu") or {}
    split: dict[str, float] = {}
    if tc.get("seconds"):
        if scenario == "cpu" and r.get("con_rate"):  # µs of each per message, at the fixed rate
            per_msg = 1e6 / (tc["seconds"] * r["con_rate"])
            split = {"loop thread us/msg": tc["loop_thread_s"] * per_msg,
                     "other threads us/msg": tc["other_threads_s"] * per_msg}
        else:
            split = {"loop thread % core": 100 * tc["loop_thread_s"] / tc["seconds"],
                     "other threads % core": 100 * tc["other_threads_s"] / tc["seconds"]}
    if scenario == "cpu":
        rate = r.get("con_rate") or 0
        return {"broker CPU us/msg": cores * 1e6 / rate, "broker CPU cores": cores, **split} if cores and rate else {}
    out = {"pub msg/s": r.get("pub_rate", 0), "con msg/s": r.get("con_rate", 0)}
    if cores is not None:
        out["broker CPU cores"] = cores
    out.update(split)
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


def median(scenario: str, results: list[dict]) -> dict[str, float]:
    """The median of each figure over the rounds (the mean of the middle two for an even count)."""
    values: dict[str, list[float]] = {}
    for r in results:
        for k, v in figures(scenario, r).items():
            values.setdefault(k, []).append(v)
    return {k: statistics.median(v) for k, v in values.items()}


BROKERS = {"lavinpy": Lavinpy, "lavinpy-never": LavinpyNever, "lavinmq": LavinMQ, "rabbitmq": RabbitMQ}
RATIOS = (("lavinpy-never", "lavinmq"), ("lavinpy", "rabbitmq"))


def run_once(amqpperf: str, broker: Broker, scenario: str, args: argparse.Namespace) -> dict:
    """One run against a fresh broker: a new data directory, started now, stopped after."""
    shutil.rmtree(broker.workdir, ignore_errors=True)
    broker.workdir.mkdir(parents=True)
    broker.port = free_port()
    broker.start()
    try:
        if scenario == "e":
            return scenario_e(amqpperf, broker, args.e_count, args.e_fill_timeout)
        return run_amqpperf(amqpperf, broker, SCENARIOS[scenario])
    finally:
        broker.stop()


def print_table(scenarios: list[str], names: list[str], results: dict) -> None:
    ratios = [(a, b) for a, b in RATIOS if a in names and b in names]
    head = f"{'scenario':<9}{'figure':<22}" + "".join(f"{n:>15}" for n in names)
    head += "".join(f"{a.replace('lavinpy-', '')}/{b}".rjust(17) for a, b in ratios)
    print("\n" + head)
    for scenario in scenarios:
        med = {n: median(scenario, results[scenario].get(n, [])) for n in names}
        keys: list[str] = []
        for n in names:
            keys += [k for k in med[n] if k not in keys]
        for key in keys:
            row = f"{scenario:<9}{key:<22}"
            for n in names:
                v = med[n].get(key)
                row += f"{v:>15,.1f}" if v is not None else f"{'-':>15}"
            for a, b in ratios:
                va, vb = med[a].get(key), med[b].get(key)
                row += f"{va / vb:>17.2f}" if va is not None and vb else f"{'-':>17}"
            print(row)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--amqpperf", required=True)
    ap.add_argument("--scenarios", default="a,b,c,d,e,cpu")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--e-count", type=int, default=E_COUNT)
    ap.add_argument("--e-fill-timeout", type=float, default=1800.0)
    ap.add_argument("--brokers", default="lavinpy,lavinpy-never,lavinmq,rabbitmq",
                    help=f"which brokers to run, of {', '.join(BROKERS)}")
    ap.add_argument("--out", default="bench/out/compare.json")
    args = ap.parse_args(argv)
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    names = [n.strip() for n in args.brokers.split(",") if n.strip()]
    unknown = [n for n in names if n not in BROKERS]
    if unknown:
        ap.error(f"unknown broker(s): {', '.join(unknown)}")
    if "lavinmq" in names and not os.access(LAVINMQ, os.X_OK):
        ap.error(f"LavinMQ binary not found at {LAVINMQ} (set LAVINMQ_BIN)")
    work = Path(tempfile.mkdtemp(prefix="lavinpy-compare-"))
    brokers = [BROKERS[n](n, work / n) for n in names]
    results: dict[str, dict[str, list[dict]]] = {s: {b.name: [] for b in brokers} for s in scenarios}
    for scenario in scenarios:
        for rnd in range(args.rounds):
            for b in brokers:
                print(f"scenario {scenario} round {rnd + 1}: {b.name}", file=sys.stderr, flush=True)
                r = run_once(args.amqpperf, b, scenario, args)
                results[scenario][b.name].append(r)
                if r.get("errors"):
                    print(f"  errors: {r['errors']}", file=sys.stderr)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print_table(scenarios, names, results)
    print(f"\nmedian of {args.rounds} rounds; raw results: {args.out}; broker logs under {work}")
    for b in brokers:  # keep the logs, drop the data
        for data in b.workdir.glob("*-data"):
            shutil.rmtree(data, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
