"""A stream's restart with and without its stored filter-value index (``filter_tags``): how long until
the index is whole again and how many records were read for it. In process, on the store and the
stream queue (no broker, no client). Opt-in; run from the repository root:

    python3 bench/stream_tags_restart.py --records 1000000

It appends ``--records`` messages (every ``--match-every``-th with ``x-stream-filter-value: rare``,
the rest ``common``, in runs of 1,000), stops cleanly (the index is written), then opens the stream
twice: with the file (loaded) and with the file removed (rebuilt from the records, as before the
file existed). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from array import array
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from lavinpy.broker.queues.publish_run import PublishRun  # noqa: E402
from lavinpy.broker.queues.stream import StreamQueue  # noqa: E402
from lavinpy.broker.queues.stream_tags import TAGS_FILE  # noqa: E402
from lavinpy.store.vhost_store import VhostStore  # noqa: E402
from tests.broker.test_stream_queue import STREAM, StandInHost, props  # noqa: E402

RUN = 1000


def open_stream(path: Path) -> tuple[VhostStore, StreamQueue]:
    """The stream on a store with the default segment size (the tests' helper uses small segments)."""
    store = VhostStore(path)
    store.open()
    index = store.open_queue("s", True, STREAM)
    store.finish_recovery()
    return store, StreamQueue(StandInHost(store), "s", index, arguments={"x-queue-type": "stream"})


def fill(path: Path, records: int, every: int) -> None:
    store, queue = open_stream(path)
    messages = store.messages
    body = b"x" * 64
    for start in range(0, records, RUN):
        count = min(RUN, records - start)
        # runs share properties: a tagged message is a run of one
        rare = [i for i in range(start, start + count) if i % every == every - 1]
        for lo, hi, value in _pieces(start, start + count, rare):
            p = props({"x-stream-filter-value": value})
            bodies = [body] * (hi - lo)
            positions = array("Q", [messages.append("ex", "rk", p, b, 1000) for b in bodies])
            queue.push_many(positions, True, PublishRun("ex", "rk", p, bodies, 1000), 0)
        if start % 100_000 == 0:
            queue.apply_retention()
    queue.stop_timers()
    store.close()


def _pieces(lo: int, hi: int, rare: list[int]):
    at = lo
    for r in rare:
        if r > at:
            yield at, r, "common"
        yield r, r + 1, "rare"
        at = r + 1
    if at < hi:
        yield at, hi, "common"


def reopen(path: Path) -> dict:
    started = time.perf_counter()
    cpu = time.process_time()
    store, queue = open_stream(path)
    reads = [0]
    plain = store.messages.read_many

    def counting(positions):
        reads[0] += len(positions)
        return plain(positions)

    store.messages.read_many = counting  # type: ignore[method-assign]
    opened = time.perf_counter() - started
    while queue.tags.rebuilding:
        queue.rebuild_tags()
    result = {"open_s": round(opened, 3), "index_whole_s": round(time.perf_counter() - started, 3),
              "cpu_s": round(time.process_time() - cpu, 3), "records_read": reads[0],
              "unknown_left": queue.tags.tags.count(255)}
    queue.stop_timers()
    store.close()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--match-every", type=int, default=100)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tags-restart-") as d:
        path = Path(d)
        t = time.perf_counter()
        fill(path, args.records, args.match_every)
        filled = time.perf_counter() - t
        [tags_file] = list(path.rglob(TAGS_FILE))
        size = tags_file.stat().st_size
        with_file = reopen(path)
        tags_file.unlink()
        without_file = reopen(path)
    print(json.dumps({"records": args.records, "fill_s": round(filled, 1), "filter_tags_bytes": size,
                      "with_file": with_file, "without_file": without_file, "load": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
