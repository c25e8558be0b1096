"""Store benchmark: append, flush, read+ack, memory per queued message and recovery time.

The store's C path (lavinpy.store._cstore) is used when built; LAVINPY_PURE_PYTHON=1 measures the
pure-Python one. The JSON line says which ran ("compiled").

Run:  python bench/store_bench.py [--quick] [--appends N] [--open-counts 1000000,10000000] [--dir D]
Prints one line per measurement and, last, one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import shutil
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from lavinpy.store.accel import COMPILED
from lavinpy.store.vhost_store import VhostStore

PROPS = b"\x00\x00"  # no basic properties


def new_store(path: Path, fsync: str = "never") -> VhostStore:
    store = VhostStore(path, fsync=fsync)
    store.open()
    return store


async def bench_append(base: Path, body_size: int, n_queues: int, count: int) -> float:
    """append + push to n durable queues, fsync never (index bytes handed to the OS every 1000)."""
    path = base / f"append-{body_size}-{n_queues}"
    store = new_store(path)
    queues = [store.open_queue(f"q{i}", durable=True) for i in range(n_queues)]
    store.finish_recovery()
    body = b"x" * body_size
    append = store.messages.append
    start = time.perf_counter()
    if n_queues == 1:
        push = queues[0].push
        for i in range(count):
            push(append("amq.direct", "rk", PROPS, body))
            if not i % 1000:
                await store.flush()
    else:
        for i in range(count):
            pos = append("amq.direct", "rk", PROPS, body)
            for q in queues:
                q.push(pos)
            if not i % 1000:
                await store.flush()
    await store.flush()
    rate = count / (time.perf_counter() - start)
    store.close()
    shutil.rmtree(path)
    return rate


async def bench_append_runs(base: Path, body_size: int, count: int, run: int = 64) -> float:
    """The publish-run path: ``append_run`` + ``push_many`` for runs of ``run`` messages, 1 queue."""
    path = base / f"append-run-{body_size}"
    store = new_store(path)
    queue = store.open_queue("q", durable=True)
    store.finish_recovery()
    bodies = [b"x" * body_size] * run
    append_run = store.messages.append_run
    push_many = queue.push_many
    start = time.perf_counter()
    for i in range(count // run):
        done = 0
        while done < run:
            done, positions = append_run("amq.direct", "rk", PROPS, bodies, done, 1_700_000_000_000)
            push_many(positions, True)
        if not i % 16:
            await store.flush()
    await store.flush()
    rate = count // run * run / (time.perf_counter() - start)
    store.close()
    shutil.rmtree(path)
    return rate


async def bench_append_flush(base: Path, count: int, every: int = 100) -> tuple[float, int]:
    """16 B to one queue with fsync always, ``await flush()`` after every ``every`` messages."""
    path = base / "append-flush"
    store = new_store(path, fsync="always")
    q = store.open_queue("q", durable=True)
    store.finish_recovery()
    body = b"x" * 16
    start = time.perf_counter()
    for i in range(count):
        q.push(store.messages.append("amq.direct", "rk", PROPS, body))
        if i % every == every - 1:
            await store.flush()
    await store.flush()
    rate = count / (time.perf_counter() - start)
    flushes = store.flush_count
    store.close()
    shutil.rmtree(path)
    return rate, flushes


async def bench_read_ack(base: Path, count: int) -> float:
    """shift + read + ack of 16 B messages from one durable queue (fsync never)."""
    path = base / "read-ack"
    store = new_store(path)
    q = store.open_queue("q", durable=True)
    store.finish_recovery()
    body = b"x" * 16
    for _ in range(count):
        q.push(store.messages.append("amq.direct", "rk", PROPS, body))
    await store.flush()
    read = store.messages.read
    start = time.perf_counter()
    i = 0
    while (pos := q.shift()) is not None:
        read(pos)
        q.ack(pos)
        i += 1
        if not i % 1000:
            await store.flush()
    await store.flush()
    rate = count / (time.perf_counter() - start)
    store.close()
    shutil.rmtree(path)
    return rate


async def bench_heap(base: Path, count: int) -> float:
    """Heap bytes per queued message in one durable queue, after the index buffers are written."""
    path = base / "heap"
    store = new_store(path)
    q = store.open_queue("q", durable=True)
    store.finish_recovery()
    body = b"x" * 16
    append = store.messages.append
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(count):
        q.push(append("amq.direct", "rk", PROPS, body))
        if not i % 10000:
            await store.flush()
    await store.flush()
    gc.collect()
    per_message = (tracemalloc.get_traced_memory()[0] - before) / count
    tracemalloc.stop()
    store.close()
    shutil.rmtree(path)
    return per_message


async def fill_queue(path: Path, count: int) -> None:
    store = new_store(path)
    q = store.open_queue("q", durable=True)
    store.finish_recovery()
    body = b"x" * 16
    push = q.push
    append = store.messages.append
    for i in range(count):
        push(append("amq.direct", "rk", PROPS, body))
        if not i % 100_000:
            await store.flush()
    store.close()  # clean: indexes compacted


def bench_open(path: Path, count: int) -> float:
    """Time to open a vhost whose one queue holds ``count`` messages (clean shutdown before)."""
    gc.collect()
    start = time.perf_counter()
    store = VhostStore(path)
    store.open()
    for name in store.queue_names_on_disk():
        store.open_queue(name, durable=True)
    store.finish_recovery()
    elapsed = time.perf_counter() - start
    assert store.queues["q"].ready_count == count, store.queues["q"].ready_count
    store.close()
    return elapsed


def bench_open_after_crash(path: Path, count: int, acked: int) -> float:
    """Open time when ``acked`` of the messages were acked and the process died (ack file not empty)."""
    store = VhostStore(path)
    store.open()
    q = store.open_queue("q", durable=True)
    store.finish_recovery()
    for _ in range(acked):
        q.ack(q.shift())
    store.close(clean=False)
    gc.collect()
    start = time.perf_counter()
    store = VhostStore(path)
    store.open()
    q = store.open_queue("q", durable=True)
    store.finish_recovery()
    elapsed = time.perf_counter() - start
    assert q.ready_count == count - acked
    store.close()
    return elapsed


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the 10M recovery case")
    parser.add_argument("--appends", type=int, default=500_000, help="messages per append case")
    parser.add_argument("--heap-count", type=int, default=1_000_000)
    parser.add_argument("--open-counts", default="1000000,10000000",
                        help="queued messages for the recovery cases (comma separated)")
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    args = parser.parse_args()
    open_counts = [int(c) for c in args.open_counts.split(",") if c]
    if args.quick:
        open_counts = [c for c in open_counts if c < 10_000_000]
    base = Path(tempfile.mkdtemp(prefix="lavinpy-bench-", dir=args.dir))
    results: dict[str, float] = {}

    def report(key: str, value: float, unit: str) -> None:
        results[key] = round(value, 3 if value < 100 else 0)
        print(f"{key:<36} {value:>14,.2f} {unit}", flush=True)

    try:
        for size in (16, 1024):
            for n_queues in (1, 3):
                rate = await bench_append(base, size, n_queues, args.appends)
                report(f"append_{size}B_{n_queues}q_per_s", rate, "msg/s")
        for size in (16, 1024):
            report(f"append_run64_{size}B_1q_per_s", await bench_append_runs(base, size, args.appends), "msg/s")
        rate, flushes = await bench_append_flush(base, min(args.appends, 200_000))
        report("append_flush100_always_per_s", rate, "msg/s")
        report("append_flush100_always_flushes", flushes, "flushes")
        report("read_ack_per_s", await bench_read_ack(base, args.appends), "msg/s")
        report("heap_bytes_per_queued_msg", await bench_heap(base, args.heap_count), "B")
        for count in open_counts:
            path = base / f"open-{count}"
            t = time.perf_counter()
            await fill_queue(path, count)
            print(f"  (filled {count:,} messages in {time.perf_counter() - t:.1f} s)", flush=True)
            report(f"open_{count}_s", bench_open(path, count), "s")
            if count <= 1_000_000:
                report(f"open_{count}_after_crash_half_acked_s",
                       bench_open_after_crash(path, count, count // 2), "s")
            shutil.rmtree(path)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps({"python": sys.version.split()[0], "compiled": COMPILED, **results}))


if __name__ == "__main__":
    asyncio.run(main())
