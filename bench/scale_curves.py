"""The brokers and the curves of bench/scale.py: each curve function measures one point against one fresh
broker and writes its figures into ``out`` as it goes (numbers, and ``errors``), so a point cut short by its
time limit keeps what it measured; it returns ``out``.

The brokers are bench/compare.py's, started the same way with the HTTP API (and the Prometheus port) on, so
the queues curve can time ``/api/queues`` and ``/metrics``; lavinpy runs at ``fsync: never`` as LavinMQ 1.0.0
confirms without fsync."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import random
import resource
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import compare
from pamqp import commands
from scale_client import BrokerClosed, Conn, keep_beating, open_many, publish_confirmed, publish_frames

HOST = "127.0.0.1"
DEFAULT_NOFILE = resource.getrlimit(resource.RLIMIT_NOFILE)
HEARTBEAT_S = 10  # the idle connections' heartbeat: frames both ways within the 10 s idle CPU window
IDLE_CPU_S = 10.0
LOAD_S = 5.0  # each amqpperf run's measured window (after a warm-up)
PUBLISH_S = 5.0  # the topic and fanout publishers' runs
BACKLOG_BODY = 1024
BACKLOG_RATE = 0  # publisher msg/s cap in the backlog fill (0 = as fast as it goes; smoke runs set one)
MEMORY_CAP = "256MiB"  # the backlog curve's broker memory cap (lavinpy and RabbitMQ; LavinMQ 1.0 has none)


def set_nofile(raised: bool) -> None:
    """Brokers inherit this process's limit: raised to the hard limit for the curves with many connections,
    the limit the bench started with (the machine's default) otherwise."""
    hard = DEFAULT_NOFILE[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard if raised else DEFAULT_NOFILE[0], hard))


class Http:
    """Where a broker serves its management API and its Prometheus metrics."""

    api_port = 0
    metrics_port = 0
    memory_cap: str | None = None

    def get_ms(self, path: str, metrics: bool = False) -> float:
        port = self.metrics_port if metrics else self.api_port
        req = urllib.request.Request(f"http://{HOST}:{port}{path}")
        req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        start = time.perf_counter()
        with urllib.request.urlopen(req, timeout=300) as response:
            response.read()
        return (time.perf_counter() - start) * 1000


class Lavinpy(Http, compare.LavinpyNever):
    def start(self) -> None:
        data = self.workdir / "lavinpy-data"
        data.mkdir(parents=True, exist_ok=True)
        self.log = self.workdir / "lavinpy.log"
        self.api_port, self.metrics_port = compare.free_port(), compare.free_port()
        config = self.workdir / "lavinpy.yaml"
        config.write_text(f"memory_high_watermark: {self.memory_cap}\n" if self.memory_cap else "{}\n")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lavinpy", "--config", str(config), "--data-dir", str(data), "--amqp-port",
             str(self.port), "--http-port", str(self.api_port), "--prometheus-port", str(self.metrics_port),
             "--mqtt-port", "0", "--bind", HOST, "--log-level", "warning", "--fsync", self.fsync],
            cwd=self.workdir, stdout=subprocess.DEVNULL, stderr=self._open_log())
        compare.wait_port(self.port, self.proc)


class LavinMQ(Http, compare.LavinMQ):
    def start(self) -> None:
        data = self.workdir / "lavinmq-data"
        data.mkdir(parents=True, exist_ok=True)
        self.log = self.workdir / "lavinmq.log"
        self.api_port = self.metrics_port = compare.free_port()
        self.proc = subprocess.Popen(
            [compare.LAVINMQ, "--data-dir", str(data), "--bind", HOST, "--amqp-port", str(self.port),
             "--http-port", str(self.api_port), "--log-level", "warn"],
            cwd=self.workdir, stdout=self._open_log(), stderr=subprocess.STDOUT)
        compare.wait_port(self.port, self.proc)


class RabbitMQ(Http, compare.RabbitMQ):
    """compare.py's private node with the management and Prometheus plugins on their own ports."""

    def start(self) -> None:
        base = self.workdir / "rabbitmq"
        base.mkdir(parents=True, exist_ok=True)
        self.api_port, self.metrics_port = compare.free_port(), compare.free_port()
        conf = [f"management.tcp.port = {self.api_port}", f"management.tcp.ip = {HOST}",
                f"prometheus.tcp.port = {self.metrics_port}", f"prometheus.tcp.ip = {HOST}"]
        if self.memory_cap:
            conf.append(f"vm_memory_high_watermark.absolute = {self.memory_cap}")
        (base / "rabbitmq.conf").write_text("\n".join(conf) + "\n")
        # The environment overrides the (empty) enabled_plugins file compare.py writes.
        os.environ["RABBITMQ_ENABLED_PLUGINS"] = "rabbitmq_management,rabbitmq_prometheus"
        try:
            super().start()
        finally:
            del os.environ["RABBITMQ_ENABLED_PLUGINS"]


BROKERS: dict[str, type] = {"lavinpy": Lavinpy, "lavinmq": LavinMQ, "rabbitmq": RabbitMQ}


def rss_kib(b: compare.Broker) -> int:
    return sum(compare.rss_kb(p) for p in b.pids)


def cpu_s(b: compare.Broker) -> float:
    total = 0
    for pid in b.pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return total / os.sysconf("SC_CLK_TCK")


def open_fds(b: compare.Broker) -> int:
    total = 0
    for pid in b.pids:
        try:
            total += len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            pass
    return total


def window() -> list[str]:
    return ["-warmup", str(min(2.0, LOAD_S / 2)), "-duration", str(LOAD_S)]


def perf(amqpperf: str, b: compare.Broker, flags: list[str]) -> dict:
    return compare.run_amqpperf(amqpperf, b, flags)


async def connect(b: compare.Broker) -> Conn:
    return await Conn().open(HOST, b.port)


@contextlib.asynccontextmanager
async def session(b: compare.Broker, out: dict) -> AsyncIterator[Conn]:
    """A connection for one point's work: the broker closing it is recorded in ``out["errors"]`` and
    the point keeps what it measured before."""
    conn = await connect(b)
    try:
        yield conn
    except BrokerClosed as exc:
        out["errors"].append(str(exc))
    finally:
        await conn.close()


async def depth(b: compare.Broker, queue: str) -> int:
    conn = await connect(b)
    try:
        ok = (await conn.rpc([commands.Queue.Declare(queue=queue, passive=True)]))[0]
        return ok.message_count
    finally:
        await conn.close()


def busy_rate(amqpperf: str, b: compare.Broker, errors: list) -> float:
    r = perf(amqpperf, b, ["-size", "16", "-autoack", *window()])  # scenario a, shorter
    errors += r.get("errors") or []
    return r.get("con_rate") or 0.0


async def connections(amqpperf: str, b: compare.Broker, n: int, args: object, out: dict) -> dict:
    """``n`` idle connections with a channel and heartbeats, and one busy publisher and consumer (amqpperf)
    before they open, while they are open and after they close."""
    errors: list = out["errors"]
    out["busy before msg/s"] = await asyncio.to_thread(busy_rate, amqpperf, b, errors)
    rss0 = rss_kib(b)
    start = time.monotonic()
    # Heartbeats start with the first connection: opening 10,000 can take longer than two heartbeat
    # intervals on a loaded machine, and a broker rightly closes a connection that missed them.
    conns: list[Conn] = []
    beats = asyncio.get_running_loop().create_task(keep_beating(conns, HEARTBEAT_S / 2))
    _, open_errors = await open_many(HOST, b.port, n, HEARTBEAT_S, opened=conns)
    out["open s"] = time.monotonic() - start
    out["opened"] = len(conns)
    errors += open_errors[:5]
    await asyncio.sleep(2)
    out["KiB per connection"] = (rss_kib(b) - rss0) / max(1, len(conns))
    cpu0, t0 = cpu_s(b), time.monotonic()
    await asyncio.sleep(IDLE_CPU_S)
    out["idle % core"] = 100 * (cpu_s(b) - cpu0) / (time.monotonic() - t0)
    out["busy open msg/s"] = await asyncio.to_thread(busy_rate, amqpperf, b, errors)
    out["still open"] = sum(1 for c in conns if c.error is None)
    beats.cancel()
    gate = asyncio.Semaphore(200)

    async def close(c: Conn) -> None:
        async with gate:
            await c.close()

    await asyncio.gather(*(close(c) for c in conns))
    await asyncio.sleep(2)
    out["busy after msg/s"] = await asyncio.to_thread(busy_rate, amqpperf, b, errors)
    if out["busy before msg/s"]:
        out["open / before"] = out["busy open msg/s"] / out["busy before msg/s"]
        out["after / before"] = out["busy after msg/s"] / out["busy before msg/s"]
    out["RSS MiB"] = rss_kib(b) / 1024
    return out


def http_times(b: Http, out: dict, errors: list) -> None:
    # lavinpy loads its HTTP stack on the first connection to a port (lavinpy.http.gate): one untimed request to
    # each port first, so that the figures are the listings' and not that load's (a few hundred ms, once).
    for path, metrics in (("/api/overview", False), ("/metrics", True)):
        try:
            b.get_ms(path, metrics)
        except OSError as exc:
            errors.append(f"GET {path}: {exc}")
    for label, path, metrics in (("/api/queues ms", "/api/queues", False), ("/metrics ms", "/metrics", True)):
        try:
            out[label] = b.get_ms(path, metrics)
        except OSError as exc:
            errors.append(f"GET {path}: {exc}")


async def served_again(b: compare.Broker, queue: str, timeout: float) -> float:
    """Seconds from starting the broker until the queue answers a passive declare."""
    t0 = time.monotonic()
    b.start()
    while True:
        try:
            await depth(b, queue)
            return time.monotonic() - t0
        except (OSError, BrokerClosed, asyncio.IncompleteReadError):
            if time.monotonic() - t0 > timeout:
                raise
            await asyncio.sleep(0.1)


async def queues(amqpperf: str, b: compare.Broker, n: int, args: object, out: dict) -> dict:
    """``n`` durable queues declared pipelined on one channel, under the default fd limit."""
    errors: list = out["errors"]
    rss0 = rss_kib(b)
    conn = await connect(b)
    declares = [commands.Queue.Declare(queue=f"scale-q-{i:06d}", durable=True) for i in range(n)]
    start = time.monotonic()
    try:
        declared = len(await asyncio.wait_for(conn.rpc(declares), getattr(args, "point_timeout", 600)))
    except (TimeoutError, BrokerClosed) as exc:
        errors.append(f"declare: {exc or 'timeout'}")
        declared = conn.answered
    out["declare q/s"] = declared / (time.monotonic() - start)
    out["declared"] = declared
    await conn.close()
    await asyncio.sleep(2)
    out["KiB per queue"] = (rss_kib(b) - rss0) / max(1, declared)
    out["RSS MiB"] = rss_kib(b) / 1024
    out["open fds"] = open_fds(b)
    assert isinstance(b, Http)
    await asyncio.to_thread(http_times, b, out, errors)
    if declared:
        b.stop()
        try:
            out["restart s"] = await served_again(b, f"scale-q-{declared - 1:06d}", 600)
            out["RSS after restart MiB"] = rss_kib(b) / 1024
        except (OSError, BrokerClosed, asyncio.IncompleteReadError, RuntimeError) as exc:
            errors.append(f"restart: {exc}")
    return out


def binding_key(i: int) -> str:
    """Wildcard patterns of four shapes; the routing key s.<k>.x matches the bindings of three of them."""
    return (f"s.{i}.#", f"s.{i}.*", f"s.*.{i}", f"*.{i}.x")[i % 4]


async def bindings(amqpperf: str, b: compare.Broker, n: int, args: object, out: dict) -> dict:
    """A topic exchange with ``n`` wildcard bindings to ten capped queues: bind rate, then the confirmed
    publish rate of 16 B messages with routing keys spread over all the bindings."""
    async with session(b, out) as conn:
        await conn.rpc([commands.Exchange.Declare(exchange="scale.topic", exchange_type="topic")]
                       + [commands.Queue.Declare(queue=f"scale-b-{j}", arguments={"x-max-length": 1000})
                          for j in range(10)])
        start = time.monotonic()
        await conn.rpc([commands.Queue.Bind(queue=f"scale-b-{i % 10}", exchange="scale.topic",
                                            routing_key=binding_key(i)) for i in range(n)])
        out["bind /s"] = n / (time.monotonic() - start)
        await asyncio.sleep(1)
        out["RSS MiB"] = rss_kib(b) / 1024
        rng = random.Random(n)
        messages = [publish_frames("scale.topic", f"s.{rng.randrange(n)}.x", b"x" * 16) for _ in range(2000)]
        r = await publish_confirmed(conn, messages, PUBLISH_S)
        out["publish msg/s"] = r["rate"]
    return out


async def bodies(amqpperf: str, b: compare.Broker, size: int, args: object, out: dict) -> dict:
    """Persistent messages of ``size`` bytes, one publisher (confirms) and one consumer (manual acks)."""
    unsettled = str(max(2, min(256, (64 << 20) // size)))
    r = await asyncio.to_thread(perf, amqpperf, b, ["-size", str(size), "-persistent", "-confirm", unsettled,
                                                    "-prefetch", unsettled, *window()])
    return {"MB/s": (r.get("con_rate") or 0) * size / 1e6, "msg/s": r.get("con_rate") or 0,
            "RSS peak MiB": (r.get("broker_rss_peak_kb") or 0) / 1024, "errors": r.get("errors") or []}


async def consumers(amqpperf: str, b: compare.Broker, n: int, args: object, out: dict) -> dict:
    """``n`` consumers (each its own connection) on one queue, one publisher, 16 B, prefetch 100 (``--prefetch``;
    ``--publishers``, ``--size`` and ``--persistent`` change the load). ``broker us/msg`` is the broker's CPU
    (utime + stime over amqpperf's measured window) per consumed message: on a shared machine the rate follows
    the cores the broker got, this does not."""
    prefetch = str(getattr(args, "prefetch", 100))
    load = ["-publishers", str(getattr(args, "publishers", 1)), "-size", str(getattr(args, "size", 16))]
    if getattr(args, "persistent", False):
        load.append("-persistent")
    warmup = getattr(args, "warmup", None)
    flags = window() if warmup is None else ["-warmup", str(warmup), "-duration", str(LOAD_S)]
    r = await asyncio.to_thread(perf, amqpperf, b, ["-consumers", str(n), "-queues", "1", *load,
                                                    "-prefetch", prefetch, *flags])
    cores = (r.get("cpu_cores") or {}).get("broker")
    rate = r.get("con_rate") or 0
    return {"con msg/s": rate, "pub msg/s": r.get("pub_rate") or 0,
            "broker cores": cores or 0, "broker us/msg": cores * 1e6 / rate if cores and rate else 0,
            "RSS peak MiB": (r.get("broker_rss_peak_kb") or 0) / 1024,
            "unconsumed at end": r.get("unconsumed_at_end") or 0,
            "con per s": r.get("con_per_s") or [], "errors": r.get("errors") or []}


async def fanout(amqpperf: str, b: compare.Broker, n: int, args: object, out: dict) -> dict:
    """One fanout exchange bound to ``n`` queues (capped at 100 messages, the oldest dropped): the confirmed
    rate of 16 B publishes, each routed to every queue."""
    async with session(b, out) as conn:
        await conn.rpc([commands.Exchange.Declare(exchange="scale.fanout", exchange_type="fanout")]
                       + [commands.Queue.Declare(queue=f"scale-f-{j:05d}", arguments={"x-max-length": 100})
                          for j in range(n)]
                       + [commands.Queue.Bind(queue=f"scale-f-{j:05d}", exchange="scale.fanout") for j in range(n)])
        r = await publish_confirmed(conn, [publish_frames("scale.fanout", "", b"x" * 16)], PUBLISH_S, window=100)
        out["publish msg/s"] = r["rate"]
        out["enqueued /s"] = r["rate"] * n
        out["RSS MiB"] = rss_kib(b) / 1024
    return out


async def backlog(amqpperf: str, b: compare.Broker, count: int, args: object, out: dict) -> dict:
    """``count`` × 1 KiB persistent into one queue with the broker's memory capped (lavinpy and RabbitMQ),
    filled and drained in 30 s amqpperf runs (6 load windows), and restarted full in between. The
    restart's memory peak is the restarted processes' VmHWM (their high-water mark since they started)."""
    queue = "scale-backlog"

    def hwm_kib() -> int:
        total = 0
        for pid in b.pids:
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            total += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0)
        return total

    step = ["-duration", str(6 * LOAD_S), "-keep-queue", "-purge=false", "-queue", queue, "-size", str(BACKLOG_BODY),
            "-persistent"]
    timeout = getattr(args, "point_timeout", 600)
    errors: list = out["errors"]
    rss_peak = 0
    start = time.monotonic()
    have = 0
    while have < count and time.monotonic() - start < timeout and not errors:
        r = await asyncio.to_thread(perf, amqpperf, b, ["-publishers", "1", "-consumers", "0", "-confirm", "1000",
                                                        "-rate", str(BACKLOG_RATE), *step])
        errors += r.get("errors") or []
        rss_peak = max(rss_peak, r.get("broker_rss_peak_kb") or 0)
        have = await depth(b, queue)
    out["filled"] = have
    out["fill msg/s"] = have / (time.monotonic() - start)
    out["RSS full MiB"] = rss_kib(b) / 1024
    b.stop()
    try:
        out["restart s"] = await served_again(b, queue, timeout)
        out["restart RSS peak MiB"] = hwm_kib() / 1024
        out["RSS after restart MiB"] = rss_kib(b) / 1024
    except (OSError, BrokerClosed, asyncio.IncompleteReadError, RuntimeError) as exc:
        errors.append(f"restart: {exc}")
        return out
    start = time.monotonic()
    left = have
    busy_s = 0  # the seconds in which the consumer got messages (a run goes on after the queue is empty)
    while left > 0 and time.monotonic() - start < timeout:
        r = await asyncio.to_thread(perf, amqpperf, b, ["-publishers", "0", "-consumers", "1", "-prefetch", "1000",
                                                        "-multi-ack", "100", *step])
        rss_peak = max(rss_peak, r.get("broker_rss_peak_kb") or 0)
        busy_s += sum(1 for n in r.get("con_per_s") or [] if n)
        if r.get("errors"):
            errors += r["errors"]
            break
        left = await depth(b, queue)
    out["drain msg/s"] = (have - left) / max(1, busy_s)
    out["RSS after drain MiB"] = rss_kib(b) / 1024
    out["RSS peak MiB"] = rss_peak / 1024
    return out


def backlog_room(workdir: Path, count: int) -> str | None:
    """The backlog needs its bytes on disk twice over (segments, indexes, headroom): None if there is room."""
    need = count * (BACKLOG_BODY + 200) * 2
    free = shutil.disk_usage(workdir).free
    return None if free >= need else f"needs {need / 2**30:.1f} GiB free, {free / 2**30:.1f} GiB left"


CURVES = {"connections": connections, "queues": queues, "bindings": bindings, "bodies": bodies,
          "consumers": consumers, "fanout": fanout, "backlog": backlog}
POINTS = {"connections": [1000, 5000, 10000], "queues": [1000, 10000, 100000], "bindings": [10000, 100000],
          "bodies": [64 << 10, 1 << 20, 16 << 20], "consumers": [1000], "fanout": [1000], "backlog": [20_000_000]}
# The curves that open many sockets: the brokers (and this process) get the raised fd limit.
RAISED_FD = {"connections", "consumers"}
