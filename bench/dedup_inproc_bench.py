"""Deduplication's cost in scenario b's shape, in process (no sockets): the broker's work per message.

A real broker on a temporary data dir (``fsync: never``) driven through the AMQP tests' harness, as
``scenario_inproc_bench.py``'s b: one publisher handing one read of ``--run`` 1 KiB persistent publishes a
round to a durable queue, one consumer at prefetch 256 acking what it got with multiple=true in one read,
without publisher confirms (they wait for the store's flush on a running event loop). With no running
loop the cache's file is written at each run (``append_soon`` writes at once). Modes as
``dedup_bench.py``: ``off`` (no headers), ``off-ids`` (each message a new identifier, a plain queue),
``on-ids`` (deduplication on, ``--cache-size`` entries, the cache filled before the timed rounds, so each
new identifier forgets the oldest). The reads are built before the timed rounds.

The figure is the thread CPU per message of the timed rounds; with ``--callgrind`` (run under
``valgrind --tool=callgrind``) the instruction counters are zeroed before the timed rounds and dumped
after them (client requests through a small helper compiled with ``cc`` at start), so
``callgrind.out.<pid>.1`` holds those rounds only: divide by the messages printed. Run from each tree:

    PYTHONPATH=<tree> python3 bench/dedup_inproc_bench.py --mode on-ids
    PYTHONPATH=<tree> valgrind --tool=callgrind --cache-sim=yes python3 bench/dedup_inproc_bench.py \\
        --mode on-ids --rounds 200 --repeat 1 --callgrind
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from consumer_harness import Harness, ack_frame
from pamqp import body, commands, frame, header

HEADER = "x-deduplication-header"
WIDTH = 16
MODES = ("off", "off-ids", "on-ids")
_HELPER = """#include <valgrind/callgrind.h>
void zero(void) { CALLGRIND_ZERO_STATS; }
void dump(void) { CALLGRIND_DUMP_STATS; }
"""


def callgrind_marks(directory: Path) -> tuple[Callable[[], None], Callable[[], None]]:
    """Zero and dump callgrind's counters (no-ops outside valgrind)."""
    source, lib = directory / "marks.c", directory / "marks.so"
    source.write_text(_HELPER)
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(lib), str(source)], check=True)
    marks = ctypes.CDLL(str(lib))
    return marks.zero, marks.dump


def reads(mode: str, run: int, rounds: int, first: int) -> list[bytes]:
    """One publisher read of ``run`` publishes per round, each message a new identifier (from ``first``)."""
    marker = "#" * WIDTH
    props = commands.Basic.Properties(delivery_mode=2, headers={HEADER: marker} if mode != "off" else None)
    one = b"".join(frame.marshal(value, 1) for value in (
        commands.Basic.Publish(exchange="", routing_key="q"),
        header.ContentHeader(0, 1024, props),
        body.ContentBody(b"x" * 1024)))
    if mode == "off":
        return [one * run] * rounds
    at = one.index(marker.encode())
    head, tail = one[:at], one[at + WIDTH:]
    return [b"".join([head + b"%016x" % n + tail for n in range(first + r * run, first + (r + 1) * run)])
            for r in range(rounds)]


def run_once(mode: str, run: int, rounds: int, warmup: int, cache_size: int,
             marks: tuple[Callable[[], None], Callable[[], None]] | None, commit: bool = False) -> float:
    if commit:  # inside a running loop: append_soon then waits for the round's commit, as in a broker
        async def rounds_in_loop() -> float:
            return _run_once(mode, run, rounds, warmup, cache_size, marks, True)
        return asyncio.run(rounds_in_loop())
    return _run_once(mode, run, rounds, warmup, cache_size, marks, False)


def _run_once(mode: str, run: int, rounds: int, warmup: int, cache_size: int,
              marks: tuple[Callable[[], None], Callable[[], None]] | None, commit: bool) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        h = Harness(Path(tmp), fsync="never")
        try:
            pub = h.connect(("127.0.0.1", 20000))
            pub.handshake()
            pub.open_channel()
            arguments = {"x-message-deduplication": True, "x-cache-size": cache_size} if mode == "on-ids" else {}
            pub.send((1, commands.Queue.Declare(queue="q", durable=True, arguments=arguments)))
            pub.read()
            con = h.connect(("127.0.0.1", 40000))
            con.handshake()
            con.open_channel()
            con.send((1, commands.Basic.Qos(prefetch_count=256)))
            con.send((1, commands.Basic.Consume(queue="q", consumer_tag="c", no_ack=False)))
            con.read()
            cache = h.broker.vhosts["/"].queues["q"].dedup
            fill = cache_size if cache is not None else 0
            if cache is not None:  # full before the timed rounds: each new identifier forgets the oldest
                template = b"\x20\x00" + _table("#" * WIDTH)
                at = template.index(b"#" * WIDTH)
                head, tail = template[:at], template[at + WIDTH:]
                for block in range(0, fill, 1024):
                    cache.new_in([head + b"%016x" % n + tail for n in range(block, block + 1024)], 1000)
            data = reads(mode, run, warmup + rounds, fill)
            store = h.broker.vhosts["/"].store
            acked = 0
            spent = 0.0
            for r, read in enumerate(data):
                if r == warmup and marks is not None:
                    marks[0]()
                t0 = time.thread_time()
                pub.conn.receive_data(read)
                h.run_soon()
                con.conn.data_to_send()
                pub.conn.data_to_send()
                last = con.conn.channels[1].deliveries.tag
                if last > acked:
                    con.conn.receive_data(ack_frame(last, multiple=True))
                    acked = last
                    h.run_soon()
                    con.conn.data_to_send()
                if commit:  # what a publisher confirm's group commit writes (``fsync: never``: no sync)
                    store.durable()
                if r >= warmup:
                    spent += time.thread_time() - t0
            if marks is not None:
                marks[1]()
            if cache is not None:
                assert len(cache) == cache_size, len(cache)
            return spent / (rounds * run) * 1e6
        finally:
            h.close()


def _table(value: str) -> bytes:
    from lavinpy.wire.field_table import encode_table
    return encode_table({HEADER: value})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=MODES, default="on-ids")
    ap.add_argument("--run", type=int, default=64, help="publishes in one publisher read")
    ap.add_argument("--rounds", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cache-size", type=int, default=100_000)
    ap.add_argument("--callgrind", action="store_true", help="zero and dump callgrind's counters around the rounds")
    ap.add_argument("--commit", action="store_true",
                    help="in a running loop, the store's durable() after each round in every mode (a confirm's "
                         "group commit at fsync never): the cache's records wait for it, as in a broker")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        marks = callgrind_marks(Path(tmp)) if args.callgrind else None
        figures = sorted(run_once(args.mode, args.run, args.rounds, args.warmup, args.cache_size, marks,
                                  args.commit)
                         for _ in range(args.repeat))
    print(f"{args.mode} run {args.run}: {args.rounds * args.run} messages timed; µs thread CPU a message: median "
          f"{figures[len(figures) // 2]:.3f}, min {figures[0]:.3f} ({', '.join(f'{f:.3f}' for f in figures)})")


if __name__ == "__main__":
    main()
