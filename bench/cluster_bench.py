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
        return amqpperf(binary, port, [process.pid], "single")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--amqpperf", default=str(REPO_ROOT / "bench" / "out" / "amqpperf"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--own-disks", type=int, default=0, metavar="MIB",
                        help="each node's data directory on its own ext4 file system of this size (root)")
    parser.add_argument("--disk-images", type=Path, default=None, metavar="DIR",
                        help="with --own-disks: where the file systems' image files go")
    args = parser.parse_args(argv)
    if not Path(args.amqpperf).exists():
        print(f"amqpperf not found at {args.amqpperf}: build it (see bench/README.md)", file=sys.stderr)
        return 2
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
