"""The pure-Python fallback's figures (``LAVINPY_PURE_PYTHON=1``) in process: a, b, c drain, d, 1,000 consumers.

Each workload runs in a child process of its own with ``LAVINPY_PURE_PYTHON=1`` and ``PYTHONPATH=<tree>``
(``--tree``, repeatable: the trees alternate per repeat), through the AMQP tests' harness as the other
in-process benches (no sockets, ``fsync: never``):

- a, b, d: ``scenario_inproc_bench.py``'s shapes (a: 16 B transient, 64 publishes a read, no-ack consumer;
  b: 1 KiB persistent, prefetch 256, one ack multiple a round; d: 100 publishers x 100 queues, 16 a read);
- c: scenario c's drain: a durable queue filled with persistent 16 B messages, then one consumer at
  prefetch 1,000 acking every delivery with its own basic.ack (as amqpperf), a read of acks a turn;
- cons100, cons10: ``consumer_round_bench.py``, 1,000 consumers on one queue at prefetch 100 / 10;
- mqtt: ``mqtt_roundtrip.py``'s QoS 1 fan-in, 100 x 1,000 messages to one subscriber at window 10, which
  answers each write with its PUBACKs in one read.

The figure is the child's thread CPU of the timed part per message (µs; medians of ``--repeat``). With
``--callgrind`` it is instructions per message instead: each workload runs twice under callgrind at two
sizes, and the difference of the totals over the messages between them cancels start-up and set-up, so
the count does not move with the machine's load.

    python3 bench/pure_bench.py [--tree OLD --tree NEW] [--workloads a,b,c,d,cons100,cons10,mqtt]
                                [--repeat 3] [--callgrind]
"""

from __future__ import annotations

import argparse
import json
import os
import site
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# workload -> (timed size, callgrind's two sizes); the size is rounds (c: messages; mqtt: round trips)
SIZES = {
    "a": (1000, (20, 520)),
    "b": (1000, (20, 220)),
    "c": (100_000, (5_000, 25_000)),
    "d": (200, (5, 45)),
    "cons100": (40, (4, 12)),
    "cons10": (40, (4, 12)),
    "mqtt": (0, (200, 1200)),
}


def _drain(size: int) -> tuple[int, float]:
    """Scenario c's drain in process: (messages, thread CPU s of the ack reads and what they start)."""
    from consumer_harness import Harness, ack_frame
    from pamqp import commands, frame

    with tempfile.TemporaryDirectory() as tmp:
        h = Harness(Path(tmp), fsync="never")
        try:
            pub = h.open_client(declare=commands.Queue.Declare(queue="c", durable=True))
            props = commands.Basic.Properties(delivery_mode=2)
            one = b"".join(frame.marshal(f[1], f[0]) for f in pub.publish(1, "c", b"x" * 16, properties=props))
            for at in range(0, size, 1000):
                pub.conn.receive_data(one * min(1000, size - at))
                h.run_soon()
                pub.conn.data_to_send()
            con = h.open_client(("127.0.0.1", 40000))
            con.send((1, commands.Basic.Qos(prefetch_count=1000)),
                     (1, commands.Basic.Consume(queue="c", consumer_tag="c")))
            con.read()
            deliveries = con.conn.channels[1].deliveries
            acked = 0
            spent = 0.0
            while acked < size:
                last = deliveries.tag
                # amqpperf's consumer acks each delivery; a read of its socket holds up to ~256 acks
                data = b"".join(ack_frame(t) for t in range(acked + 1, min(last, acked + 256) + 1))
                acked = min(last, acked + 256)
                t0 = time.thread_time()
                con.conn.receive_data(data)
                h.run_soon()
                spent += time.thread_time() - t0
                con.conn.data_to_send()
            return size, spent
        finally:
            h.close()


def _mqtt(size: int) -> tuple[int, float]:
    """mqtt_roundtrip.py's QoS 1 fan-in round trips (a tree before the broker's scheduler drives a read as
    its transport did then): (messages delivered in ``size`` round trips, or all, and their thread CPU s)."""
    import gc

    from mqtt_roundtrip import _connected

    from lavinpy.mqtt import codec
    from lavinpy.mqtt.sessions import MQTTSessions
    from tests.amqp.session_client import Harness

    gc.set_threshold(100_000, 50, 1000)  # the server's thresholds
    with tempfile.TemporaryDirectory() as data_dir:
        harness = Harness(Path(data_dir), fsync="never")
        try:
            broker = harness.broker
            sessions = MQTTSessions(broker)
            sub = _connected(sessions, "sub")
            sub.receive_data(bytes((0x82, 8)) + b"\x00\x01\x00\x03t/#\x01")
            harness.run_soon()
            sub.data_to_send()
            for i in range(100):
                pub = _connected(sessions, f"p{i}")
                pub.receive_data(b"".join(codec.publish("t/a", b"x" * 16, 1, False, False, j + 1)
                                          for j in range(1000)))
                harness.run_soon()
                pub.data_to_send()
            scheduler = getattr(broker, "scheduler", None)
            deferring = hasattr(sub, "settle_deferred")
            reader = codec.PacketReader(1 << 24)
            messages = trips = 0
            spent = 0.0
            out = b"".join(sub.data_to_send())
            while out and not (size and trips >= size):
                ids = [codec.parse_publish(flags, body).packet_id for kind, flags, body in reader.feed(out)
                       if kind == codec.PUBLISH]
                messages += len(ids)
                trips += 1
                data = b"".join(codec.puback(packet_id) for packet_id in ids)
                t0 = time.thread_time()
                if scheduler is not None:
                    held = scheduler.hold()
                    if deferring:
                        sub.receive_data(data, True)
                    else:
                        sub.receive_data(data)
                    if scheduler.queues:
                        scheduler.run_deliveries()
                    out = b"".join(sub.data_to_send())
                    if deferring:
                        sub.settle_deferred()
                    scheduler.release(held)
                else:
                    sub.receive_data(data)
                    if broker.delivery_pending:
                        broker.run_deliveries()
                    out = b"".join(sub.data_to_send())
                harness.run_soon()  # what waits for the loop's next turn, both trees' alike
                out += b"".join(sub.data_to_send())
                spent += time.thread_time() - t0
            return messages, spent
        finally:
            harness.close()


def child(workload: str, size: int) -> None:
    """Runs one workload in this process (pure Python already selected) and prints its JSON line."""
    if workload in ("a", "b", "d"):
        import scenario_inproc_bench as s
        run = 16 if workload == "d" else 64
        warmup = 2 if workload == "d" else 5
        per = s.run_once(workload, run, size, warmup)
        messages = size * run * s.SHAPES[workload][0]
        out = {"messages": messages, "cpu_s": per * messages / 1e6}
    elif workload == "c":
        messages, spent = _drain(size)
        out = {"messages": messages, "cpu_s": spent}
    elif workload in ("cons100", "cons10"):
        import consumer_round_bench as r
        ns = argparse.Namespace(consumers=1000, prefetch=100 if workload == "cons100" else 10, run=3500,
                                every=4, rounds=size)
        per, delivered = r.run_once(ns)
        out = {"messages": delivered, "cpu_s": per * delivered / 1e6}
    elif workload == "mqtt":
        messages, spent = _mqtt(size)
        out = {"messages": messages, "cpu_s": spent}
    else:
        raise SystemExit(f"unknown workload {workload}")
    print("PURE_BENCH " + json.dumps(out))


def _command(workload: str, size: int) -> list[str]:
    return [str(HERE / "pure_bench.py"), "--child", workload, "--size", str(size)]


def _env(tree: str) -> dict[str, str]:
    env = dict(os.environ, LAVINPY_PURE_PYTHON="1", PYTHONHASHSEED="0")
    # the child runs the real interpreter (see _run): a virtual environment's packages are named here
    env["PYTHONPATH"] = os.pathsep.join([tree, *site.getsitepackages()])
    return env


def _run(tree: str, workload: str, size: int, valgrind: list[str] | None = None) -> dict[str, float]:
    # the interpreter as invoked, not resolved: a venv's interpreter keeps its packages
    cmd = (valgrind or []) + [sys.executable] + _command(workload, size)
    # outside the trees, so that `tests` and `lavinpy` come from PYTHONPATH
    done = subprocess.run(cmd, env=_env(tree), cwd=tempfile.gettempdir(), capture_output=True, text=True,
                          check=False)
    if done.returncode:
        raise RuntimeError(f"{workload} in {tree}: {done.stderr[-2000:]}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("PURE_BENCH "))
    return json.loads(line.split(" ", 1)[1])


def _instructions(tree: str, workload: str, size: int) -> tuple[int, float]:
    """Callgrind's total instructions of one run, and the messages it ran."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        figure = _run(tree, workload, size, ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"])
        total = next(line for line in out.read_text().splitlines() if line.startswith(("summary:", "totals:")))
        return int(total.split()[1]), figure["messages"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", help="a lavinpy tree (default: this one)")
    ap.add_argument("--workloads", default="a,b,c,d,cons100,cons10,mqtt")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--callgrind", action="store_true", help="instructions per message (one pair of runs each)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.size)
        return
    trees = args.tree or [str(HERE.parent)]
    workloads = args.workloads.split(",")
    unit = "instructions a message" if args.callgrind else "µs thread CPU a message"
    print(f"pure-Python fallback, {unit}")
    for workload in workloads:
        if args.callgrind:
            row = []
            for tree in trees:
                small, large = SIZES[workload][1]
                i1, m1 = _instructions(tree, workload, small)
                i2, m2 = _instructions(tree, workload, large)
                row.append(f"{(i2 - i1) / (m2 - m1):,.0f}")
        else:
            figures: dict[str, list[float]] = {t: [] for t in trees}
            for i in range(args.repeat):  # the trees alternate: old, new, then new, old
                for tree in trees if i % 2 == 0 else trees[::-1]:
                    r = _run(tree, workload, SIZES[workload][0])
                    figures[tree].append(r["cpu_s"] / r["messages"] * 1e6)
            row = []
            for tree in trees:
                f = sorted(figures[tree])
                row.append(f"{f[len(f) // 2]:.3f} ({', '.join(f'{x:.3f}' for x in figures[tree])})")
        print(f"{workload:8} " + " | ".join(f"{t}: {v}" for t, v in zip(trees, row, strict=True)), flush=True)


if __name__ == "__main__":
    main()
