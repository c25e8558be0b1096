"""Benchmark of the PySpark data source: batch write with confirms and batch read, stream and classic queues.

    python bench/spark_bench.py                 # starts its own lavinpy, 1,000,000 rows each way
    python bench/spark_bench.py --rows 300000 --kinds stream,classic,quorum   # quicker, three rounds
    python bench/spark_bench.py --kinds classic             # classic queues only
    python bench/spark_bench.py --url amqp://guest:guest@127.0.0.1:5672/   # any broker with streams
    python bench/spark_bench.py --broker lavinmq --kinds classic   # the same source through a peer broker
    python bench/spark_bench.py --cpus 0:1      # Spark on core 0, the broker on core 1 (as on its own host)
    python bench/spark_bench.py --conf spark.python.unix.domain.socket.enabled=true   # any Spark setting

Needs Java, `pip install pyspark pyarrow`. Spark runs local[2]; the broker, the JVM and the Python
workers share the machine (or their cores: --cpus). Figures (rows/s) include Spark's own per-row cost,
measured separately, just before and just after each run, with a data source that discards its input
(`spark_floor_*`, the mean of the two); `*_of_floor` is Spark's own time over the lavinpy run's (1.0: the broker and the
client cost nothing visible), `cpu_*_of_floor` the same by CPU seconds of every role (the figure to
read on a shared machine: see bench/README.md).
With --pairs K, each way runs K times a round alternated with K + 1 floors (tight pairs: each run
against the two floors beside it), and the round's share is the median of its K.
A warm-up round of every path comes first (unrecorded); the summary is each kind's median over the
rounds, with the floor's spread ((max - min) / median of its times) and what the run added over the
floor by role (the tasks' Python workers, the JVM; µs a row). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from pamqp import commands  # noqa: E402

from lavinpy.spark.client import AMQPParams, Connection  # noqa: E402


def start_lavinpy(workdir: Path, fsync: str | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """A lavinpy of this tree on a free port (fsync: its default, always, unless given)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    with open(workdir / "lavinpy.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "lavinpy", "--data-dir", str(workdir / "data"),
                                 "--amqp-port", str(port), "--http-port", "0", "--mqtt-port", "0",
                                 "--prometheus-port", "0", "--log-level", "warning",
                                 *(["--fsync", fsync] if fsync else [])],
                                cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"lavinpy did not start; see {workdir / 'lavinpy.log'}") from None
            time.sleep(0.05)
    return proc, f"amqp://guest:guest@127.0.0.1:{port}/"


def declare_queue(url: str, name: str, kind: str) -> None:
    with Connection(AMQPParams.from_url(url)).open() as conn:
        ch = conn.open_channel()
        conn.call(ch, commands.Queue.Declare(queue=name, durable=True, arguments={"x-queue-type": kind}),
                  commands.Queue.DeclareOk)


def delete_queue(url: str, name: str) -> None:
    with Connection(AMQPParams.from_url(url)).open() as conn:
        ch = conn.open_channel()
        conn.call(ch, commands.Queue.Delete(queue=name), commands.Queue.DeleteOk)


def make_spark(conf: dict[str, str] | None = None) -> Any:
    """Spark local[2] with the bench's settings and ``conf`` (--conf) on top, for floors and runs alike."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    from pyspark.sql import SparkSession

    from lavinpy.spark import register

    builder = (SparkSession.builder.master("local[2]").appName("lavinpy-spark-bench")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false").config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.memory", "2g"))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def _cpu_list(text: str) -> set[int]:
    """'0', '0,1' or '0-3' -> cpu numbers."""
    cpus: set[int] = set()
    for item in text.split(","):
        first, _, last = item.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def _pin_broker(cpus: set[int]) -> None:
    """Every thread of the broker's processes (_roles_now's "broker": RabbitMQ's beam.smp under its
    script too) on cpus."""
    for member, (role, _cpu) in _roles_now().items():
        if role != "broker":
            continue
        try:
            for tid in os.listdir(f"/proc/{member}/task"):
                with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
                    os.sched_setaffinity(int(tid), cpus)
        except FileNotFoundError:  # a process that ended meanwhile
            pass


def register_floor_sources(spark: Any) -> None:
    """Data sources that do no I/O: what Spark itself costs per row on each path."""
    import pyarrow as pa
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, DataSourceReader, InputPartition

    from lavinpy.spark.datasource import PublishedMessages
    from lavinpy.spark.read_rows import read_schema

    class Discard(DataSourceArrowWriter):
        def write(self, iterator: Any) -> PublishedMessages:
            return PublishedMessages(sum(batch.num_rows for batch in iterator))

    class Generate(DataSourceReader):
        """The rows a read of the bench's queue gives (the same names, properties and body length), from
        one batch built once: Spark's cost for those rows, without the broker and the client."""

        def __init__(self, rows: int, body_bytes: int, routing_key: str, delivery_mode: int, offsets: bool) -> None:
            self.rows, self.body_bytes = rows, body_bytes
            self.routing_key, self.delivery_mode, self.offsets = routing_key, delivery_mode, offsets

        def partitions(self) -> list[InputPartition]:
            return [InputPartition(0), InputPartition(1)]

        def read(self, partition: InputPartition) -> Any:
            from pyspark.sql.pandas.types import to_arrow_schema

            schema = to_arrow_schema(read_schema(), timezone="UTC")
            n = 8192
            body = b"x" * self.body_bytes
            given = {"offset": pa.array(range(n) if self.offsets else [None] * n, pa.int64()),
                     "body": pa.array([body] * n, pa.binary()),
                     "routing_key": pa.array([self.routing_key] * n, pa.string()),
                     "exchange": pa.array([""] * n, pa.string()),
                     "delivery_mode": pa.array([self.delivery_mode] * n, pa.int32()),
                     "redelivered": pa.array([False] * n, pa.bool_())}
            batch = pa.RecordBatch.from_arrays([given.get(f.name, pa.array([None] * n, f.type)) for f in schema],
                                               schema=schema)
            share = self.rows // 2 + (self.rows % 2 if partition.value == 0 else 0)  # exactly `rows` in all
            for _ in range(share // n):
                yield batch
            if share % n:
                yield batch.slice(0, share % n)

    class Floor(DataSource):
        @classmethod
        def name(cls) -> str:
            return "spark_floor"

        def schema(self) -> Any:
            return read_schema()

        def writer(self, schema: Any, overwrite: bool) -> Discard:
            return Discard()

        def reader(self, schema: Any) -> Generate:
            return Generate(int(self.options["rows"]), int(self.options["bodyBytes"]),
                            self.options.get("routingKey", ""), int(self.options.get("deliveryMode", "2")),
                            self.options.get("offsets", "true") == "true")

    spark.dataSource.register(Floor)


def bodies(spark: Any, rows: int, body_bytes: int, partitions: int) -> Any:
    return spark.range(0, rows, 1, partitions).selectExpr(
        f"cast(rpad(concat('event-', id, '-'), {body_bytes}, 'x') AS binary) AS body")


BROKER_PID: int | None = None  # the broker the bench started: its CPU time is read per phase


def broker_cpu_s() -> float:
    """utime + stime of the broker the bench started (0 for one given by --url)."""
    if BROKER_PID is None:
        return 0.0
    # The broker's own process and its descendants (RabbitMQ's beam.smp runs under its start script).
    return sum(own for role, own in _roles_now().values() if role == "broker")


def _proc_stat(pid: int) -> tuple[str, int, float, float] | None:
    """(command name, parent pid, own CPU s, reaped children's CPU s) of a process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            head, _, rest = f.read().rpartition(")")
    except OSError:
        return None
    fields = rest.split()
    tick = os.sysconf("SC_CLK_TCK")
    return (head.partition("(")[2], int(fields[1]), (int(fields[11]) + int(fields[12])) / tick,
            (int(fields[13]) + int(fields[14])) / tick)


def _roles_now() -> dict[int, tuple[str, float]]:
    """pid -> (role, own CPU seconds so far) of every live process of the bench: this driver process,
    Spark's JVM, Spark's Python workers (any other descendant), the broker."""
    stats = {pid: st for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
             if (st := _proc_stat(pid)) is not None}
    me = os.getpid()
    found: dict[int, tuple[str, float]] = {}
    for pid, (name, _ppid, own, _children) in stats.items():
        at, hops, role = pid, 0, None
        while at > 1 and hops < 64 and role is None:
            if at == BROKER_PID:
                role = "broker"
            elif at == me:
                role = "driver" if pid == me else "jvm" if name == "java" else "python_workers"
            at = stats[at][1] if at in stats else 0
            hops += 1
        if role is not None:
            found[pid] = (role, own)
    return found


class RoleSampler:
    """CPU seconds by role over a window. Spark's Python workers come and go (and the daemon that
    forks them does not collect their times), so every process is sampled every 0.5 s and counted
    with its last sample: a process that exits loses at most its last 0.5 s (workers are reused)."""

    def __init__(self) -> None:
        self.first = _roles_now()
        self.last = dict(self.first)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.last.update(_roles_now())

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        self.last.update(_roles_now())
        roles = {"driver": 0.0, "jvm": 0.0, "python_workers": 0.0, "broker": 0.0}
        for pid, (role, own) in self.last.items():
            roles[role] += own - (self.first[pid][1] if pid in self.first else 0.0)
        return {k: round(v, 2) for k, v in roles.items()}


def timed(fn: Any, cpu: list[float] | None = None, roles: dict[str, float] | None = None) -> float:
    """Wall-clock seconds of fn(); the broker's CPU seconds meanwhile are appended to cpu, and every
    role's CPU seconds (RoleSampler) are stored in roles."""
    cpu0 = broker_cpu_s()
    sampler = RoleSampler() if roles is not None else None
    start = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - start
    if cpu is not None:
        cpu.append(broker_cpu_s() - cpu0)
    if roles is not None and sampler is not None:
        roles.update(sampler.stop())
    return elapsed


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else round((ordered[mid - 1] + ordered[mid]) / 2, 3)


def _cpu_share(floor: dict[str, float], run: dict[str, float]) -> float:
    """Spark's floor CPU (JVM + Python workers) over the run's (JVM + Python workers + broker): on a
    machine whose cores are all busy, the ceiling of the wall-clock share, and steadier than it."""
    spent = run["jvm"] + run["python_workers"] + run["broker"]
    return round((floor["jvm"] + floor["python_workers"]) / spent, 3) if spent else 0.0


def _added_us(roles: dict[str, dict[str, float]], rows: int) -> dict[str, float]:
    """What the lavinpy run cost beyond Spark's floor, µs a row, by role: the tasks' Python workers and
    the JVM over the floor's, the broker's whole; and the wall time not covered by that CPU on the
    machine's cores (waiting: round trips, idle tasks)."""
    out: dict[str, float] = {}
    for way in ("write", "read"):
        run, floor = roles[way], roles[f"floor_{way}"]
        out[f"{way}_workers_added_us"] = round((run["python_workers"] - floor["python_workers"]) / rows * 1e6, 2)
        out[f"{way}_jvm_added_us"] = round((run["jvm"] - floor["jvm"]) / rows * 1e6, 2)
    return out


def _mean_roles(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: round((a[k] + b[k]) / 2, 3) for k in a}


def _cpu_us(roles: dict[str, dict[str, float]], rows: int) -> dict[str, float]:
    """CPU µs a row of each phase (all roles) and of the floor (JVM + Python workers)."""
    out: dict[str, float] = {}
    for way in ("write", "read"):
        run, floor = roles[way], roles[f"floor_{way}"]
        out[f"{way}_cpu_us"] = round((run["jvm"] + run["python_workers"] + run["broker"]) / rows * 1e6, 2)
        out[f"floor_{way}_cpu_us"] = round((floor["jvm"] + floor["python_workers"]) / rows * 1e6, 2)
    return out


def _paired(floor: Any, runs: list[Any], times: list[float], shares: list[float], cpu_shares: list[float],
            roles: dict[str, dict[str, float]], way: str, broker_cpu: list[float]) -> None:
    """Floor, run, floor, run, ..., floor: each run's share is of the mean of the two floors beside it
    (the floor drifts with the machine's other load within seconds: only neighbours compare). The first
    pair's roles are kept for the by-role figures; every floor's time goes into times."""
    bracket: dict[str, float] = {}
    times.append(timed(floor, roles=bracket))
    for i, run in enumerate(runs):
        run_roles: dict[str, float] = {}
        cpu: list[float] = []
        run_s = timed(run, cpu, run_roles)
        after: dict[str, float] = {}
        times.append(timed(floor, roles=after))
        floor_roles = _mean_roles(bracket, after)
        shares.append(((times[-2] + times[-1]) / 2) / run_s)
        cpu_shares.append(_cpu_share(floor_roles, run_roles))
        broker_cpu.append(cpu[0])
        if i == 0:
            roles[way], roles[f"floor_{way}"] = run_roles, floor_roles
            roles[f"{way}_s"] = {"s": run_s}
        bracket = after


def one_run(spark: Any, url: str, args: Any, kind: str, round_no: int) -> dict[str, Any]:
    """For one queue kind: Spark's floor and the lavinpy write alternated (--pairs writes, each into its
    own queue, a floor before and after each); then the same for the reads, one queue each (round -1: a
    warm-up, printed as such). Each share is of the mean of the two floors beside its run: the floor
    drifts with the machine's other load within a minute, and a run compared with a floor taken only
    before it (or in another round) carries that drift. A round's share is the median of its pairs'."""
    queues = [f"bench-{kind}-{uuid.uuid4().hex[:8]}" for _ in range(args.pairs)]
    for queue in queues:
        declare_queue(url, queue, kind)
    roles: dict[str, dict[str, float]] = {}

    def floor_write() -> None:
        bodies(spark, args.rows, args.body_bytes, args.partitions).write.format("spark_floor").mode("append").save()

    def floor_read() -> None:
        # The rows the reads give: the queues' names (as long as each other) as routing keys, persistent,
        # and offsets from streams only.
        (spark.read.format("spark_floor").option("rows", args.rows).option("bodyBytes", args.body_bytes)
         .option("routingKey", queues[0]).option("deliveryMode", 2)
         .option("offsets", str(kind == "stream").lower()).load()
         .selectExpr("count(*)", "sum(length(body))", "max(offset)").collect())

    def write(queue: str) -> Any:
        return lambda: (bodies(spark, args.rows, args.body_bytes, args.partitions).write.format("lavinpy")
                        .mode("append").option("url", url).option("queue", queue)
                        .option("maxInFlight", args.max_in_flight).save())

    result: list[Any] = []

    def read(queue: str) -> Any:
        reader = spark.read.format("lavinpy").option("url", url).option("queue", queue)
        if args.broker == "lavinmq":  # its refusal of the kind check names no argument: named, no probe delivery
            reader = reader.option("queueType", kind)
        if kind == "stream":
            reader = reader.option("maxMessagesPerPartition", str(-(-args.rows // 2)))
        if args.prefetch:
            reader = reader.option("prefetch", args.prefetch)
        return lambda: result.append(reader.load().selectExpr(
            "count(*) AS n", "sum(length(body)) AS bytes", "max(offset) AS last").collect()[0])

    floors: dict[str, list[float]] = {"write": [], "read": []}
    shares: dict[str, list[float]] = {"write": [], "read": []}
    cpu_shares: dict[str, list[float]] = {"write": [], "read": []}
    broker: dict[str, list[float]] = {"write": [], "read": []}
    _paired(floor_write, [write(q) for q in queues], floors["write"], shares["write"], cpu_shares["write"], roles,
            "write", broker["write"])
    _paired(floor_read, [read(q) for q in queues], floors["read"], shares["read"], cpu_shares["read"], roles,
            "read", broker["read"])
    for got in result:
        assert got.n == args.rows, f"read {got.n} rows, expected {args.rows}"
    for queue in queues:
        delete_queue(url, queue)
    write_s, read_s = roles.pop("write_s")["s"], roles.pop("read_s")["s"]
    floor_w = (floors["write"][0] + floors["write"][1]) / 2
    floor_r = (floors["read"][0] + floors["read"][1]) / 2
    n = args.rows
    run = {"kind": kind, "round": round_no, "pairs": args.pairs, "write_rows_per_s": round(args.rows / write_s),
           "read_rows_per_s": round(n / read_s), "write_s": round(write_s, 2), "read_s": round(read_s, 2),
           "spark_floor_write_s": round(floor_w, 2), "spark_floor_read_s": round(floor_r, 2),
           "spark_floor_write_bracket_s": [round(t, 2) for t in floors["write"]],
           "spark_floor_read_bracket_s": [round(t, 2) for t in floors["read"]],
           "write_of_floor": median(shares["write"]), "read_of_floor": median(shares["read"]),
           "write_of_floor_pairs": [round(x, 3) for x in shares["write"]],
           "read_of_floor_pairs": [round(x, 3) for x in shares["read"]],
           "broker_us_per_write": round(median(broker["write"]) / args.rows * 1e6, 2),
           "broker_us_per_read": round(median(broker["read"]) / n * 1e6, 2),
           "cpu_write_of_floor": median(cpu_shares["write"]), "cpu_read_of_floor": median(cpu_shares["read"]),
           "cpu_write_of_floor_pairs": cpu_shares["write"], "cpu_read_of_floor_pairs": cpu_shares["read"],
           **_added_us(roles, args.rows), **_cpu_us(roles, args.rows),
           "load_average": os.getloadavg()[0], "cpu_s_by_role": roles}
    label = "warm-up" if round_no < 0 else f"round {round_no}"
    if args.pairs > 1:
        print(f"        pairs' shares, write / read: {run['write_of_floor_pairs']} / {run['read_of_floor_pairs']}; "
              f"by CPU {run['cpu_write_of_floor_pairs']} / {run['cpu_read_of_floor_pairs']}", flush=True)
    print(f"{kind:7} {label}: write {run['write_rows_per_s']:,} rows/s ({run['write_of_floor']:.0%} of "
          f"Spark alone, {floor_w:.2f} s), read {run['read_rows_per_s']:,} rows/s ({run['read_of_floor']:.0%} of "
          f"Spark alone, {floor_r:.2f} s); broker {run['broker_us_per_write']} / {run['broker_us_per_read']} µs "
          f"a message; load {run['load_average']:.1f}", flush=True)
    print(f"        added µs a row (workers, JVM): write {run['write_workers_added_us']}, {run['write_jvm_added_us']}; "
          f"read {run['read_workers_added_us']}, {run['read_jvm_added_us']}", flush=True)
    for phase, by_role in roles.items():
        print(f"        CPU s {phase:11}: " + ", ".join(f"{k} {v:.2f}" for k, v in by_role.items()), flush=True)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="use this broker instead of starting one (its CPU is not counted)")
    parser.add_argument("--broker", choices=("lavinpy", "lavinmq", "rabbitmq"), default="lavinpy",
                        help="the broker the bench starts (a peer: LavinMQ 1.0.0 as bench/compare.py finds it, "
                        "or Debian's rabbitmq-server), its CPU counted as the broker's; LavinMQ 1.0 has no "
                        "streams: --kinds classic")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--body-bytes", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=2, help="write tasks (local[2] runs 2 at a time)")
    parser.add_argument("--max-in-flight", default="20000")
    parser.add_argument("--prefetch", help="the read's prefetch option (default: the source's)")
    parser.add_argument("--kinds", default="stream,classic", help="queue kinds to write and read, in turn")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (each kind once per round, floor first); "
                        "the summary is each figure's median over the rounds")
    parser.add_argument("--pairs", type=int, default=1, help="lavinpy runs a round alternated with floors, each "
                        "way (writes into a queue each, reads one each): a round's share is their median")
    parser.add_argument("--fsync", choices=("always", "never"), help="the started lavinpy's fsync setting "
                        "(default: its own, always; never beside LavinMQ 1.0, which confirms without an fsync)")
    parser.add_argument("--cpus", help="SPARK:BROKER cpu lists (e.g. 0:1): Spark (its driver, JVM and Python "
                        "workers) and the broker pinned to separate cores, floors and runs alike, as with a broker on "
                        "its own host; by default everything shares every core")
    parser.add_argument("--warmup", type=int, default=1, help="unrecorded rounds first (full size, every kind)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting for the session (repeatable), floors and runs alike: e.g. "
                        "spark.python.unix.domain.socket.enabled=true (see docs/spark.md, Performance)")
    args = parser.parse_args()
    if any("=" not in item for item in args.conf):
        parser.error("--conf takes KEY=VALUE")
    spark_conf = dict(item.split("=", 1) for item in args.conf)
    if args.fsync and (args.url or args.broker != "lavinpy"):
        parser.error("--fsync sets the lavinpy the bench starts; it does not apply with --url or a peer")

    workdir = Path(tempfile.mkdtemp(prefix="lavinpy-spark-bench-"))
    proc = None
    url = args.url
    peer = None
    global BROKER_PID
    if url is None and args.broker == "lavinpy":
        proc, url = start_lavinpy(workdir, args.fsync)
        BROKER_PID = proc.pid
    elif url is None:
        import compare  # bench/compare.py: the peers as its comparisons start them

        peer = {"lavinmq": compare.LavinMQ, "rabbitmq": compare.RabbitMQ}[args.broker](args.broker, workdir)
        peer.start()
        url, BROKER_PID = peer.uri, peer.proc.pid
    try:
        if args.cpus:
            spark_cpus, broker_cpus = (_cpu_list(part) for part in args.cpus.split(":"))
            _pin_broker(broker_cpus)  # (none with --url)
            os.sched_setaffinity(0, spark_cpus)  # the JVM and its Python workers inherit it
        spark = make_spark(spark_conf)
        register_floor_sources(spark)
    except BaseException:
        _stop_brokers(proc, peer)
        raise
    results: dict[str, Any] = {"rows": args.rows, "body_bytes": args.body_bytes, "broker": "external" if args.url
                               else f"{args.broker} (started by the bench)", "cpus": args.cpus or "shared",
                               "fsync": args.fsync or "default", "spark_conf": spark_conf}
    kinds = [kind.strip() for kind in args.kinds.split(",")]
    runs: list[dict[str, Any]] = []
    try:
        # Warm-up: every measured path (Spark's floor and lavinpy, both ways, each kind) once at full
        # size, unrecorded: the JVM compiles its hot paths and the Python workers import and start,
        # so that the first recorded floor is not a cold JVM's (several times slower).
        for _ in range(args.warmup):
            for kind in kinds:
                one_run(spark, url, args, kind, -1)
        # Spark's floor is measured before each run: the machine may be shared, and only figures
        # taken in the same minutes compare.
        for round_no in range(args.repeat):
            for kind in kinds:
                runs.append(one_run(spark, url, args, kind, round_no))
        results["runs"] = runs
        for kind in kinds:
            mine = [r for r in runs if r["kind"] == kind]
            got = results[kind] = {key: median([r[key] for r in mine]) for key in
                                   ("write_of_floor", "read_of_floor", "cpu_write_of_floor", "cpu_read_of_floor",
                                    "broker_us_per_write", "broker_us_per_read", "write_workers_added_us",
                                    "read_workers_added_us", "write_jvm_added_us", "read_jvm_added_us",
                                    "spark_floor_write_s", "spark_floor_read_s", "write_cpu_us", "read_cpu_us",
                                    "floor_write_cpu_us", "floor_read_cpu_us")}
            # The floor's own spread over the rounds: a share is only as steady as the floor under it.
            for way in ("write", "read"):
                floors = [r[f"spark_floor_{way}_s"] for r in mine]
                got[f"spark_floor_{way}_spread"] = round((max(floors) - min(floors)) / median(floors), 3)
                # ... and within a round: the two floors around one run, apart by this share of their mean.
                got[f"spark_floor_{way}_bracket_spread"] = median(
                    [abs(a - b) / ((a + b) / 2) for r in mine
                     for a, b in itertools.pairwise(r[f"spark_floor_{way}_bracket_s"])])
                # every pair's share (all rounds): the median and the range the figure comes from
                for share in (f"{way}_of_floor", f"cpu_{way}_of_floor"):
                    every = sorted(x for r in mine for x in r[f"{share}_pairs"])
                    got[f"{share}_all_pairs"] = [round(every[0], 3), median(every), round(every[-1], 3)]
            print(f"{kind:7} median of {len(mine)}: CPU µs a row, run / floor: write {got['write_cpu_us']} / "
                  f"{got['floor_write_cpu_us']}, read {got['read_cpu_us']} / {got['floor_read_cpu_us']}; the floors "
                  f"around a run apart by {got['spark_floor_write_bracket_spread']:.0%} / "
                  f"{got['spark_floor_read_bracket_spread']:.0%}", flush=True)
            print(f"{kind:7} median of {len(mine)}: write {got['write_of_floor']:.0%}, read {got['read_of_floor']:.0%} "
                  f"of Spark alone (by CPU {got['cpu_write_of_floor']:.0%}, {got['cpu_read_of_floor']:.0%}); broker "
                  f"{got['broker_us_per_write']} / {got['broker_us_per_read']} µs a message; tasks' workers "
                  f"+{got['write_workers_added_us']} / +{got['read_workers_added_us']} µs a row over the floor's; "
                  f"floor {got['spark_floor_write_s']} s (spread {got['spark_floor_write_spread']:.0%}) / "
                  f"{got['spark_floor_read_s']} s (spread {got['spark_floor_read_spread']:.0%})", flush=True)
            print(f"{kind:7} all {len(mine) * args.pairs} pairs (min, median, max): write "
                  f"{got['write_of_floor_all_pairs']}, read {got['read_of_floor_all_pairs']}; by CPU write "
                  f"{got['cpu_write_of_floor_all_pairs']}, read {got['cpu_read_of_floor_all_pairs']}", flush=True)
    finally:
        spark.stop()
        _stop_brokers(proc, peer)
    print(json.dumps(results))


def _stop_brokers(proc: subprocess.Popen[bytes] | None, peer: Any) -> None:
    if proc is not None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    if peer is not None:
        peer.stop()


if __name__ == "__main__":
    main()
