"""Cluster figures (see bench/README.md, "Cluster"): scenario b against one node, a three-node cluster
through its leader and through a follower's forwarding port, then the failover time over repeated
kill -9 of the leader. Prints a table; not a test.

    python3 bench/cluster_bench.py --amqpperf bench/out/amqpperf [--rounds 2] [--kills 20] [--own-disks 512]

Needs ``etcd`` on PATH. Throughput runs alternate the three set-ups ``--rounds`` times (medians are
shown) so that load from elsewhere on the machine hits them alike. Failover is the time from the
kill -9 of the leader to a successful queue.declare on the new leader's own AMQP port; each killed
node is restarted and back in the in-sync replica set before the next kill.

``--own-disks MIB`` (root only, never needed by CI) puts each node's data directory, and the single
node's, on an ext4 file system of its own (an image file on a loop device, removed afterwards): the
nodes then no longer share one file system's journal, which on one machine is part of what a
cluster's confirm waits for (bench/history.md); ``--disk-images DIR`` puts the image files there
(on a tmpfs: no disk under any node).

``--rate N[,N...]`` (instead of the full-rate rounds and the kills) runs scenario b at each fixed
publish rate against one node and the cluster (through the leader and through a follower) and prints
the CPU budget: each process's and each thread group's CPU a message (utime + stime from
/proc/<pid>/task/*/stat over amqpperf's measured window) for the nodes' threads (the asyncio loop, the
compiled fsync workers, the rest: on a leader its replication writer threads, on a follower its
replication thread), amqpperf and etcd, with the run-queue wait (/proc/<pid>/task/<tid>/schedstat)
a message and a wake-up, and the machine's busy cores (/proc/stat).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "bench"))

from bench_broker import process_cpu_seconds  # noqa: E402
from compare import SCENARIOS, figures  # noqa: E402

from tests.cluster.harness import PREFIX, Cluster, Etcd, free_port, port_open, wait_until  # noqa: E402

SCENARIO = "b"  # 1 KiB persistent, confirm 256, prefetch 256


def scenario_window() -> tuple[float, float]:
    """The measured window of the scenario's amqpperf run: (warm-up s, duration s)."""
    args = SCENARIOS[SCENARIO]
    return float(args[args.index("-warmup") + 1]), float(args[args.index("-duration") + 1])


def amqpperf(binary: str, port: int, pids: list[int], label: str) -> dict:
    """One run; ``node_cpu_s``: each pid's CPU seconds over (about) amqpperf's measured window, read
    from /proc here, so that the cluster's cost per message can be split per node."""
    cmd = [binary, "-uri", f"amqp://guest:guest@127.0.0.1:{port}/", "-broker-pid", ",".join(map(str, pids)),
           "-label", label, *SCENARIOS[SCENARIO]]
    warmup, duration = scenario_window()
    per_node: list[float] = []
    done = threading.Event()

    def sample() -> None:
        if done.wait(warmup):
            return
        before = [process_cpu_seconds(pid) for pid in pids]
        if done.wait(duration):
            return
        per_node.extend(process_cpu_seconds(pid) - start for pid, start in zip(pids, before, strict=True))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()  # amqpperf connects in a few ms: its window and this one start together
    out = subprocess.run(cmd, capture_output=True, text=True)
    done.set()
    sampler.join()
    try:
        result = json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"errors": [f"amqpperf exit {out.returncode}: {out.stderr.strip()[-500:]}"]}
    if len(per_node) == len(pids):
        result["node_cpu_s"] = per_node
        result["node_window_s"] = duration
    return result


@contextlib.contextmanager
def own_disk(mount_point: Path, mib: int, images: Path | None = None) -> Iterator[None]:
    """An ext4 file system of ``mib`` MiB mounted at ``mount_point`` for the block, on a loop device
    over a sparse image file in ``images`` (default: beside the mount point; a tmpfs there takes the
    disk out of the figures altogether)."""
    image = (images or mount_point.parent) / f"{mount_point.parent.name}-{mount_point.name}.img"
    mount_point.mkdir(parents=True, exist_ok=True)
    with open(image, "wb") as f:
        f.truncate(mib * 1024 * 1024)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    device = subprocess.run(["losetup", "--find", "--show", str(image)], check=True,
                            capture_output=True, text=True).stdout.strip()
    try:
        subprocess.run(["mount", device, str(mount_point)], check=True)
        try:
            yield
        finally:
            subprocess.run(["umount", str(mount_point)], check=False)
    finally:
        subprocess.run(["losetup", "--detach", device], check=False)
        image.unlink(missing_ok=True)


def single_node(binary: str, data_dir: Path, disk_mib: int = 0, images: Path | None = None) -> dict:
    with own_disk(data_dir, disk_mib, images) if disk_mib else contextlib.nullcontext():
        return _single_node(binary, data_dir)


def _single_node(binary: str, data_dir: Path) -> dict:
    with single_node_process(data_dir) as (pid, port):
        return amqpperf(binary, port, [pid], "single")


@contextlib.contextmanager
def single_node_process(data_dir: Path) -> Iterator[tuple[int, int]]:
    """A single node on a free port for the block: (its pid, its AMQP port)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAVINPY_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    with open(data_dir.parent / f"{data_dir.name}.log", "ab") as log:
        process = subprocess.Popen([sys.executable, "-m", "lavinpy", "--data-dir", str(data_dir),
                                    "--bind", "127.0.0.1", "--amqp-port", str(port), "--http-port", "0",
                                    "--prometheus-port", "0", "--mqtt-port", "0"],
                                   env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: port_open(port), 60, 0.1, "the single node")
        yield process.pid, port
    finally:
        process.terminate()
        process.wait(30)


def isr(etcd: Etcd) -> list[str]:
    value = etcd.get(f"{PREFIX}/isr")
    return json.loads(value[0]) if value else []


def wait_in_sync(cluster: Cluster) -> None:
    wait_until(lambda: {n.node_id for n in cluster.nodes} <= set(isr(cluster.etcd)), 120, 0.1, "a full ISR")


def cluster_runs(binary: str, cluster: Cluster) -> dict[str, dict]:
    leader = cluster.wait_for_leader(60)
    wait_in_sync(cluster)
    follower = next(n for n in cluster.nodes if n is not leader)
    # In this order, for the per-node split: the leader, the follower clients connect to through it,
    # the other follower.
    ordered = [leader, follower, *(n for n in cluster.nodes if n not in (leader, follower))]
    pids = [n.process.pid for n in ordered if n.process is not None]
    results = {"cluster via leader": amqpperf(binary, leader.amqp_port, pids, "leader")}
    wait_in_sync(cluster)
    results["cluster via follower"] = amqpperf(binary, follower.amqp_port, pids, "follower")
    return results


def failovers(cluster: Cluster, kills: int) -> list[float]:
    times = []
    leader = cluster.wait_for_leader(60)
    for _ in range(kills):
        wait_in_sync(cluster)
        time.sleep(0.5)
        leader.kill()
        killed_at = time.monotonic()
        successor = cluster.wait_for_leader(30, exclude=leader)  # a queue.declare answered
        times.append(time.monotonic() - killed_at)
        print(f"  failover {len(times)}: {times[-1]:.2f} s", flush=True)
        leader.start()
        leader = successor
    return times


CLOCK_TICK = os.sysconf("SC_CLK_TCK")


def thread_readings(pid: int) -> dict[int, tuple[str, float, float, int]]:
    """Each thread of ``pid``: tid -> (name, CPU s (utime + stime), run-queue wait s, times run)."""
    readings = {}
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                stat = (task / "stat").read_text()
                run_ns, wait_ns, slices = map(int, (task / "schedstat").read_text().split()[:3])
            except (OSError, ValueError):
                continue  # the thread ended between the listing and the read
            fields = stat.rsplit(")", 1)[1].split()
            readings[int(task.name)] = (stat[stat.index("(") + 1:stat.rindex(")")],
                                        (int(fields[11]) + int(fields[12])) / CLOCK_TICK, wait_ns / 1e9, slices)
    return readings


def busy_cores_reading() -> tuple[float, float]:
    """(busy, all) jiffies of the whole machine, from /proc/stat's cpu line."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values[:8]) - idle, sum(values[:8])


def thread_group(pid: int, tid: int, name: str, rest: str, older: set[int]) -> str:
    """What a node's thread is: its loop (the main thread), a compiled fsync worker (they name
    themselves), a thread started while amqpperf connected (not in ``older``: the client connections'
    socket reader and writer threads), or ``rest`` (the other threads are not named: on a node under b
    they are the leader's replication writer threads or a follower's replication thread, beside idle
    executor threads)."""
    if tid == pid:
        return "loop"
    if name.startswith("lavinpy-fsync"):
        return "fsync workers"
    if tid not in older:
        return "client socket threads"
    return rest


def rate_run(binary: str, port: int, processes: list[tuple[str, int, str]], rate: int, label: str) -> dict:
    """Scenario b at a fixed publish rate; ``processes``: (label, pid, label of its unnamed threads),
    amqpperf and etcd included. Returns amqpperf's result with ``budget``: label -> group ->
    (CPU s, run-queue wait s, times run) over the measured window, and ``busy_cores``."""
    args = list(SCENARIOS[SCENARIO]) + ["-rate", str(rate)]
    cmd = [binary, "-uri", f"amqp://guest:guest@127.0.0.1:{port}/", "-label", label, *args]
    warmup, duration = scenario_window()
    older = {pid: set(thread_readings(pid)) for _, pid, _ in processes}
    perf = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watched = [*processes, ("amqpperf", perf.pid, "amqpperf")]
    time.sleep(warmup)
    before = {pid: thread_readings(pid) for _, pid, _ in watched}
    machine_before = busy_cores_reading()
    time.sleep(duration)
    after = {pid: thread_readings(pid) for _, pid, _ in watched}
    machine_after = busy_cores_reading()
    stdout, stderr = perf.communicate()
    try:
        result = json.loads(stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"errors": [f"amqpperf exit {perf.returncode}: {stderr.strip()[-500:]}"]}
    budget: dict[str, dict[str, list[float]]] = {}
    for name, pid, rest in watched:
        groups = budget.setdefault(name, {})
        for tid, (thread_name, cpu, wait, slices) in after[pid].items():
            start = before[pid].get(tid, (thread_name, 0.0, 0.0, 0))
            group = rest if name in ("amqpperf", "etcd") else thread_group(pid, tid, thread_name, rest, older[pid])
            totals = groups.setdefault(group, [0.0, 0.0, 0.0])
            for i, value in enumerate((cpu - start[1], wait - start[2], slices - start[3])):
                totals[i] += value
    result["budget"] = budget
    busy = machine_after[0] - machine_before[0]
    result["busy_cores"] = busy / max(1, machine_after[1] - machine_before[1]) * (os.cpu_count() or 1)
    result["window_s"] = duration
    return result


def rate_budgets(binary: str, work: Path, rates: list[int]) -> None:
    """The CPU budget at each fixed rate: one node, then a fresh cluster through its leader and a follower."""
    for rate in rates:
        runs: list[tuple[str, dict]] = []
        with single_node_process(work / f"single-{rate}") as (pid, port):
            runs.append(("single node", rate_run(binary, port, [("node", pid, "other threads")], rate, "single")))
        etcd = Etcd(work / f"etcd-{rate}")
        etcd.start()
        cluster = Cluster(work / f"cluster-{rate}", etcd)
        try:
            cluster.start(3)
            leader = cluster.wait_for_leader(60)
            wait_in_sync(cluster)
            follower = next(n for n in cluster.nodes if n is not leader)
            other = next(n for n in cluster.nodes if n not in (leader, follower))
            assert etcd.process is not None
            processes = [("leader", leader.process.pid, "writer threads"),  # type: ignore[union-attr]
                         ("follower 1", follower.process.pid, "replication thread"),  # type: ignore[union-attr]
                         ("follower 2", other.process.pid, "replication thread"),  # type: ignore[union-attr]
                         ("etcd", etcd.process.pid, "etcd")]
            runs.append(("via leader", rate_run(binary, leader.amqp_port, processes, rate, "leader")))
            wait_in_sync(cluster)
            runs.append(("via follower 1", rate_run(binary, follower.amqp_port, processes, rate, "follower")))
        finally:
            cluster.stop_all()
            etcd.stop()
        print_budget(rate, runs)


def print_budget(rate: int, runs: list[tuple[str, dict]]) -> None:
    """Per run: the rate reached, and for each process and thread group CPU µs a message, run-queue
    wait µs a message and µs a wake-up (time run), and the share of a core."""
    for setup, result in runs:
        if result.get("errors") or not result.get("pub_rate"):
            print(f"rate {rate}: {setup}: {result.get('errors')}", flush=True)
            continue
        messages = result["pub_rate"] * result["window_s"]
        total = sum(cpu for groups in result["budget"].values() for cpu, _, _ in groups.values())
        p99_ms = (result.get("latency_us") or {}).get("p99", 0) / 1000
        print(f"rate {rate}: {setup}: {result['pub_rate']:.0f} msg/s published, p99 {p99_ms:.1f} ms, "
              f"machine {result['busy_cores']:.2f} cores busy, "
              f"watched processes {total / result['window_s']:.2f} cores, {total * 1e6 / messages:.1f} us a message")
        print(f"  {'process':<12}{'threads':<20}{'CPU us/msg':>11}{'cores':>7}{'wait us/msg':>12}"
              f"{'wait us/wake':>13}{'wakes/msg':>10}")
        for name, groups in result["budget"].items():
            for group, (cpu, wait, slices) in sorted(groups.items(), key=lambda item: -item[1][0]):
                if cpu == 0 and slices == 0:
                    continue
                print(f"  {name:<12}{group:<20}{cpu * 1e6 / messages:>11.2f}{cpu / result['window_s']:>7.2f}"
                      f"{wait * 1e6 / messages:>12.2f}{wait * 1e6 / max(1, slices):>13.1f}"
                      f"{slices / messages:>10.3f}")
    print(flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--amqpperf", default=str(REPO_ROOT / "bench" / "out" / "amqpperf"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--own-disks", type=int, default=0, metavar="MIB",
                        help="each node's data directory on its own ext4 file system of this size (root)")
    parser.add_argument("--disk-images", type=Path, default=None, metavar="DIR",
                        help="with --own-disks: where the file systems' image files go")
    parser.add_argument("--rate", default="", metavar="N[,N...]",
                        help="instead: the CPU budget a process and a thread at these fixed publish rates")
    args = parser.parse_args(argv)
    if not Path(args.amqpperf).exists():
        print(f"amqpperf not found at {args.amqpperf}: build it (see bench/README.md)", file=sys.stderr)
        return 2
    if args.rate:
        with tempfile.TemporaryDirectory(prefix="lavinpy-cluster-bench-") as tmp:
            rate_budgets(args.amqpperf, Path(tmp), [int(r) for r in args.rate.split(",")])
        return 0
    results: dict[str, list[dict]] = {"single node": [], "cluster via leader": [], "cluster via follower": []}
    times: list[float] = []
    with tempfile.TemporaryDirectory(prefix="lavinpy-cluster-bench-") as tmp:
        work = Path(tmp)
        for round_ in range(args.rounds):
            print(f"round {round_ + 1}: single node", flush=True)
            results["single node"].append(single_node(args.amqpperf, work / f"single{round_}", args.own_disks,
                                                       args.disk_images))
            print(f"round {round_ + 1}: three-node cluster", flush=True)
            etcd = Etcd(work / f"etcd{round_}")  # a fresh etcd and cluster each round
            etcd.start()
            cluster = Cluster(work / f"cluster{round_}", etcd)
            disks = contextlib.ExitStack()
            try:
                for node in cluster.add(3):
                    if args.own_disks:
                        disks.enter_context(own_disk(node.data_dir, args.own_disks, args.disk_images))
                    node.start()
                for name, result in cluster_runs(args.amqpperf, cluster).items():
                    results[name].append(result)
                if round_ == args.rounds - 1 and args.kills:
                    print(f"failover over {args.kills} kills", flush=True)
                    times = failovers(cluster, args.kills)
            finally:
                cluster.stop_all()
                etcd.stop()
                disks.close()
    print_table(results)
    if times:
        print(f"failover (kill -9 to a queue.declare on the new leader) over {len(times)} kills: "
              f"min {min(times):.2f} s, median {statistics.median(times):.2f} s, max {max(times):.2f} s")
    return 0


def print_table(results: dict[str, list[dict]]) -> None:
    single = None
    print(f"{'set-up':<22}{'pub msg/s':>11}{'con msg/s':>11}{'p99 ms':>9}{'vs single':>11}{'CPU us/msg':>12}"
          f"  {'per node us/msg':<20}errors")
    for name, runs in results.items():
        rows = [figures(SCENARIO, r) for r in runs]
        rows = [r for r in rows if r]
        errors = sum(1 for r in runs if r.get("errors"))
        if not rows:
            print(f"{name:<22}{'-':>11}{'-':>11}{'-':>9}{'-':>11}{'-':>12}  {'-':<20}{errors}")
            continue
        pub = statistics.median(r["pub msg/s"] for r in rows)
        con = statistics.median(r["con msg/s"] for r in rows)
        p99 = statistics.median(r.get("p99 latency ms", 0) for r in rows)
        # Broker CPU per message: every node's (amqpperf reads them all from /proc), so the cluster's
        # figure is what the three nodes together spend; it holds where wall-clock rates are noisy.
        cpu = [r["broker CPU cores"] * 1e6 / r["pub msg/s"] for r in rows
               if r.get("broker CPU cores") and r["pub msg/s"]]
        cpu_text = f"{statistics.median(cpu):>12.1f}" if cpu else f"{'-':>12}"
        single = single or pub
        print(f"{name:<22}{pub:>11.0f}{con:>11.0f}{p99:>9.1f}{pub / single:>10.0%}{cpu_text}"
              f"  {per_node_text(runs):<20}{errors}")


def per_node_text(runs: list[dict]) -> str:
    """Median CPU µs per message of each node (the leader first, then the follower clients went
    through, then the other), from the /proc readings over amqpperf's window."""
    splits = [[seconds * 1e6 / (r["pub_rate"] * r["node_window_s"]) for seconds in r["node_cpu_s"]]
              for r in runs if r.get("node_cpu_s") and r.get("pub_rate")]
    if not splits:
        return "-"
    return " / ".join(f"{statistics.median(column):.1f}" for column in zip(*splits, strict=True))


if __name__ == "__main__":
    sys.exit(main())
