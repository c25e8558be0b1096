"""The deduplication cache's own work per identifier, in process: CPU time per new identifier asked
one message at a time (``seen_in``) and a publish run at a time (``new_in``), on a full cache with
its file (the records rendered and written as a group commit would, every ``--commit`` messages; a
rewrite when the file has grown enough). No broker, no client: what the event loop spends in the
cache for each message of scenario b with deduplication on. Run from the repository root:

    python3 bench/dedup_cache_bench.py
    python3 bench/dedup_cache_bench.py --cache-size 128 --run 16
    python3 bench/dedup_cache_bench.py --tree ../old   # another source tree (one at a time only there)
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def blocks(count: int, prefix: str) -> list[bytes]:
    """Persistent messages' property blocks, each with a new 20-character identifier."""
    from lavinpy.wire.field_table import encode_table
    return [b"\x30\x00" + encode_table({"x-deduplication-header": f"{prefix}{n:017d}"}) + b"\x02"
            for n in range(count)]


async def measure(args: argparse.Namespace, store: Any, way: str) -> float:
    from lavinpy.broker.queues.dedup_cache import DedupCache
    from lavinpy.broker.settings.deduplication import DedupSettings
    cache = DedupCache(DedupSettings(cache_size=args.cache_size), store.open_append_file(f"dedup.{way}"))
    assert cache._file is not None
    take = cache._file.take_unsynced_fds
    best = float("inf")
    for rnd in range(args.rounds + 1):  # the first round fills the cache
        run = blocks(args.count, f"{rnd:03d}")
        started = time.process_time()
        for at in range(0, len(run), args.run):
            part = run[at:at + args.run]
            if way == "run":
                cache.new_in(part, 1000)
            else:
                for block in part:
                    cache.seen_in(block, 1000)
            if at // args.commit != (at + args.run) // args.commit:
                take()  # the group commit's write (its fsync is the worker's, not measured here)
        if rnd:
            best = min(best, (time.process_time() - started) * 1e6 / len(run))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache-size", type=int, default=100_000)
    ap.add_argument("--count", type=int, default=200_000, help="new identifiers per round")
    ap.add_argument("--run", type=int, default=64, help="messages per publish run")
    ap.add_argument("--commit", type=int, default=256, help="messages per group commit")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tree", default=str(Path(__file__).resolve().parent.parent), help="source tree to measure")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(args.tree).resolve()))
    from lavinpy.broker.queues.dedup_cache import DedupCache
    from lavinpy.server import GC_THRESHOLDS
    from lavinpy.store.vhost_store import VhostStore
    gc.set_threshold(*GC_THRESHOLDS)
    with tempfile.TemporaryDirectory() as directory:
        store = VhostStore(Path(directory))
        store.open()
        for way in ("one", "run") if hasattr(DedupCache, "new_in") else ("one",):
            figure = asyncio.run(measure(args, store, way))
            print(f"{way:>4}: {figure:.3f} us CPU per new identifier (best of {args.rounds})")
        store.close()


if __name__ == "__main__":
    main()
