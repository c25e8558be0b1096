"""Cost curves: how lavinpy's cost grows with connections, queues, bindings, body size, consumers and backlog,
side by side with LavinMQ 1.0.0 and RabbitMQ 3.10 in one sitting (see bench/README.md, "Cost curves").

Each point runs against a fresh broker (bench/compare.py's, with the HTTP API on; lavinpy at ``fsync: never``),
the brokers alternating per point. Curves (the default points in brackets):

- connections [1k, 5k, 10k]: idle connections, a channel each, 10 s heartbeats, opened by one asyncio process;
  RSS per connection, the broker's idle CPU over 10 s, and a busy publisher and consumer (amqpperf, 16 B,
  autoack) before they open, while they are open and after they close (``after / before``).
- queues [1k, 10k, 100k]: durable queues declared pipelined under the default fd limit: declare rate, RSS per
  queue, open fds, ``GET /api/queues`` and ``/metrics`` time, restart time (until the last queue answers).
- bindings [10k, 100k]: a topic exchange with wildcard bindings: bind rate, confirmed publish rate.
- bodies [64 KiB, 1 MiB, 16 MiB; 128 MiB with --big-bodies]: persistent, confirms: MB/s and RSS peak
  (``--http-in-use``: each broker's HTTP API asked once first, so that lavinpy's RSS includes its HTTP stack).
- consumers [1k]: consumers on one queue, with the broker's CPU per consumed message (the figure to compare on a
  shared machine, where the rate follows the cores the broker got); fanout [1k]: one publish routed to that many
  queues.

``--repeat N`` runs each point N times per broker, the brokers alternating, and reports each run and the medians
(the JSON keeps the medians where one run's figures were, and the runs under ``runs``).
- backlog [20M x 1 KiB] only with --backlog: fill, restart, drain with the memory capped; disk checked first,
  data removed after.

Load comes from amqpperf (bench/compare.sh builds it); idle connections, declares, binds and the topic and
fanout publishers from bench/scale_client.py. Prints a table per curve, writes scale.json and one PNG per
curve (matplotlib) into --out.

    python3 bench/scale.py --amqpperf bench/out/amqpperf [--brokers lavinpy,lavinmq,rabbitmq]
        [--curves connections,queues,bindings,bodies,consumers,fanout] [--points connections=20,50;queues=50]
        [--repeat 3] [--prefetch 10] [--publishers 4 --size 64 --persistent] [--warmup 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import compare
import scale_curves as sc

X_LABELS = {"connections": "idle connections", "queues": "durable queues", "bindings": "topic bindings",
            "bodies": "body bytes", "consumers": "consumers on one queue", "fanout": "queues bound to the fanout",
            "backlog": "messages queued"}
NOT_PLOTTED = {"wall s", "opened", "still open", "declared", "filled"}  # bookkeeping: in the tables and the JSON
RUN_KEYS = ("con msg/s", "broker us/msg", "broker cores", "unconsumed at end")  # a repeated point's lines per run


def median_of(runs: list[dict]) -> dict:
    """One point's figures from its repeated runs: each number the median of the runs that have it, the
    errors of all; the runs themselves under ``runs`` (not a number: the tables and plots pass over it)."""
    figures: dict = {"errors": [e for r in runs for e in r.get("errors", [])]}
    for r in runs:
        for key, v in r.items():
            if key not in figures and isinstance(v, (int, float)) and not isinstance(v, bool):
                figures[key] = statistics.median(x[key] for x in runs if isinstance(x.get(key), (int, float)))
    if len(runs) > 1:
        figures["runs"] = runs
    return figures


def parse_points(text: str) -> dict[str, list[int]]:
    """``connections=20,50;queues=50`` (sizes may end in k or M)."""
    points: dict[str, list[int]] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        curve, _, values = part.partition("=")
        if curve not in sc.CURVES:
            raise argparse.ArgumentTypeError(f"unknown curve {curve!r}")
        points[curve] = [int(float(v[:-1]) * {"k": 1e3, "M": 1e6}[v[-1]]) if v[-1] in "kM" else int(v)
                         for v in values.split(",") if v]
    return points


def run_point(curve: str, name: str, point: int, args: argparse.Namespace, work: Path) -> dict:
    """One point against a fresh broker: a new data directory, started now, stopped and removed after."""
    workdir = work / f"{name}-{curve}-{point}"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    broker = sc.BROKERS[name](name, workdir)
    broker.memory_cap = sc.MEMORY_CAP if curve == "backlog" else None
    sc.set_nofile(curve in sc.RAISED_FD)
    started = time.monotonic()
    figures: dict = {"errors": []}
    # Each step (declares, fill, drain, restart) is bounded by --point-timeout; the whole point by a multiple.
    limit = args.point_timeout * (4 if curve == "backlog" else 3)
    try:
        broker.start()
        if args.http_in_use:  # the management API and /metrics asked once, as a broker watched by an operator
            sc.http_times(broker, {}, figures["errors"])
        figures.update(asyncio.run(asyncio.wait_for(
            sc.CURVES[curve](args.amqpperf, broker, point, args, figures), limit)))
    except Exception as exc:  # one point failing (a broker that dies, a timeout) must not end the sitting
        figures["errors"].append(f"{type(exc).__name__}: {exc or 'point timed out'}")
    finally:
        broker.stop()
        sc.set_nofile(True)
        for data in workdir.glob("*-data"):  # keep the logs, drop the data
            shutil.rmtree(data, ignore_errors=True)
        shutil.rmtree(workdir / "rabbitmq" / "mnesia", ignore_errors=True)
    figures["wall s"] = round(time.monotonic() - started, 1)
    return figures


def print_table(curve: str, names: list[str], points: list[int], results: dict) -> None:
    ratio = "lavinpy" in names and "lavinmq" in names
    print(f"\n{curve}: {X_LABELS[curve]}")
    print(f"{'point':>11}  {'figure':<24}" + "".join(f"{n:>13}" for n in names)
          + (f"{'lavinpy/lavinmq':>17}" if ratio else ""))
    for point in points:
        per = {n: results[n].get(str(point), {}) for n in names}
        keys: list[str] = []
        for n in names:
            keys += [k for k, v in per[n].items() if k not in keys and isinstance(v, (int, float))]
        for key in keys:
            row = f"{point:>11,}  {key:<24}"
            for n in names:
                v = per[n].get(key)
                row += f"{v:>13,.2f}" if isinstance(v, float) and abs(v) < 100 else (
                    f"{v:>13,.0f}" if isinstance(v, (int, float)) else f"{'-':>13}")
            if ratio:
                a, b = per["lavinpy"].get(key), per["lavinmq"].get(key)
                row += f"{a / b:>17.2f}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b \
                    else f"{'-':>17}"
            print(row)
        for n in names:
            for i, run in enumerate(per[n].get("runs", [])):
                print(f"{'':>13}{n} run {i + 1}: " + ", ".join(
                    f"{k} {run[k]:,.2f}" if abs(run[k]) < 100 else f"{k} {run[k]:,.0f}"
                    for k in (k for k in RUN_KEYS if isinstance(run.get(k), (int, float)))))
        for n in names:
            for err in per[n].get("errors", [])[:3]:
                print(f"{'':>13}{n}: {str(err)[:150]}")


def plot(curve: str, names: list[str], points: list[int], results: dict, out: Path) -> Path | None:
    """One PNG per curve: a panel per figure, the point on the x axis (log), a line per broker."""
    try:
        import matplotlib  # type: ignore[import-not-found]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found]
    except ImportError:
        print("matplotlib is not installed: no plots (pip install matplotlib)", file=sys.stderr)
        return None
    keys: list[str] = []
    for n in names:
        for p in points:
            keys += [k for k, v in results[n].get(str(p), {}).items()
                     if k not in keys and k not in NOT_PLOTTED and isinstance(v, (int, float))]
    if not keys:
        return None
    cols = min(3, len(keys))
    rows = (len(keys) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, key in zip(axes.flat, keys, strict=False):
        for n in names:
            xs = [p for p in points if isinstance(results[n].get(str(p), {}).get(key), (int, float))]
            ax.plot(xs, [results[n][str(p)][key] for p in xs], marker="o", label=n)
        ax.set_title(key, fontsize=10)
        ax.set_xlabel(X_LABELS[curve], fontsize=8)
        if len(points) > 1 and max(points) / max(1, min(points)) >= 10:
            ax.set_xscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    fig.suptitle(f"{curve} (one fresh broker per point; the median of repeated runs)")
    fig.tight_layout()
    path = out / f"scale-{curve}.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def replot(json_path: Path, out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    for curve, per in json.loads(json_path.read_text())["curves"].items():
        names = list(per)
        points = sorted({int(p) for n in names for p in per[n]})
        print_table(curve, names, points, per)
        png = plot(curve, names, points, per, out)
        if png:
            print(f"plot: {png}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--amqpperf", default="bench/out/amqpperf")
    ap.add_argument("--brokers", default="lavinpy,lavinmq,rabbitmq", help=f"of {', '.join(sc.BROKERS)}")
    ap.add_argument("--curves", default="connections,queues,bindings,bodies,consumers,fanout",
                    help=f"of {', '.join(sc.CURVES)}")
    ap.add_argument("--points", type=parse_points, default={}, help="override sizes: connections=20,50;queues=1k")
    ap.add_argument("--prefetch", type=int, default=100, help="each consumer's prefetch in the consumers curve")
    ap.add_argument("--publishers", type=int, default=1, help="publishers in the consumers curve")
    ap.add_argument("--size", type=int, default=16, help="body bytes in the consumers curve")
    ap.add_argument("--persistent", action="store_true", help="persistent messages in the consumers curve")
    ap.add_argument("--warmup", type=float, help="seconds of load before the consumers curve's measured window"
                    " (default: 2, or half of it with --quick)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each point and broker, the brokers alternating"
                    " (ABBA): the table shows each run and the medians")
    ap.add_argument("--big-bodies", action="store_true", help="add 128 MiB to the bodies curve")
    ap.add_argument("--http-in-use", action="store_true",
                    help="one request to the management API and /metrics after each start (lavinpy loads its HTTP "
                         "stack on the first one: its RSS then includes it, as LavinMQ's always does)")
    ap.add_argument("--backlog", action="store_true", help="allow the backlog curve (20M x 1 KiB, tens of GiB)")
    ap.add_argument("--quick", action="store_true", help="1 s load windows and 2 s idle CPU (smoke runs only)")
    ap.add_argument("--point-timeout", type=float, default=600.0,
                    help="seconds one step of a point may take (the whole point: three times that)")
    ap.add_argument("--workdir", help="where the brokers' data goes (default: a new temporary directory)")
    ap.add_argument("--out", default="bench/out/scale", help="directory for scale.json and the PNGs")
    ap.add_argument("--replot", metavar="JSON", help="print the tables and draw the plots of an earlier sitting")
    args = ap.parse_args(argv)
    if args.replot:
        return replot(Path(args.replot), Path(args.out))
    names = [n for n in args.brokers.split(",") if n]
    curves = [c for c in args.curves.split(",") if c]
    for bad, known in ((set(names) - set(sc.BROKERS), "broker"), (set(curves) - set(sc.CURVES), "curve")):
        if bad:
            ap.error(f"unknown {known}(s): {', '.join(sorted(bad))}")
    if not os.access(args.amqpperf, os.X_OK):
        ap.error(f"no amqpperf at {args.amqpperf} (bench/compare.sh builds it)")
    if "lavinmq" in names and not os.access(compare.LAVINMQ, os.X_OK):
        ap.error(f"LavinMQ binary not found at {compare.LAVINMQ} (set LAVINMQ_BIN)")
    if "backlog" in curves and not args.backlog:
        ap.error("the backlog curve writes tens of GiB: pass --backlog to run it")
    if args.quick:
        sc.LOAD_S = sc.PUBLISH_S = 1.0
        sc.IDLE_CPU_S = 2.0
        sc.BACKLOG_RATE = 2000
    points = {**sc.POINTS, **args.points}
    if args.big_bodies and "bodies" not in args.points:
        points["bodies"] = [*points["bodies"], 128 << 20]
    work = Path(args.workdir or tempfile.mkdtemp(prefix="lavinpy-scale-"))
    if "backlog" in curves:
        work.mkdir(parents=True, exist_ok=True)
        room = sc.backlog_room(work, max(points["backlog"]))
        if room:
            ap.error(f"not enough disk for the backlog curve under {work}: {room}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sc.set_nofile(True)  # this process holds the idle connections
    print(f"fd limit: default {sc.DEFAULT_NOFILE[0]}, raised {sc.DEFAULT_NOFILE[1]} (connections, consumers)",
          file=sys.stderr)
    results: dict = {"fd_limit": list(sc.DEFAULT_NOFILE), "python": sys.version.split()[0], "curves": {}}
    json_path = out / "scale.json"
    for curve in curves:
        per: dict[str, dict] = {n: {} for n in names}
        results["curves"][curve] = per
        for point in points[curve]:
            runs: dict[str, list[dict]] = {n: [] for n in names}
            for i in range(max(1, args.repeat)):
                # The order turns each repeat (A B, B A, A B...) so a drift of the machine's load over the
                # sitting falls on both brokers alike.
                for name in names if i % 2 == 0 else names[::-1]:
                    print(f"{curve} {point:,}: {name}" + (f" run {i + 1}" if args.repeat > 1 else ""),
                          file=sys.stderr, flush=True)
                    runs[name].append(run_point(curve, name, point, args, work))
                    per[name][str(point)] = median_of(runs[name]) if args.repeat > 1 else runs[name][0]
                    json_path.write_text(json.dumps(results, indent=1))  # a partial sitting keeps what it measured
        print_table(curve, names, points[curve], per)
        png = plot(curve, names, points[curve], per, out)
        if png:
            print(f"plot: {png}")
    print(f"\nraw results: {json_path}; broker logs under {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
