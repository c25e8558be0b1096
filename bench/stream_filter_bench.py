"""Stream filtering: how much sooner a filtered consumer reaches the end of a stream than an unfiltered
one reads all of it. Opt-in (not part of the tests); run from the repository root:

    python3 bench/stream_filter_bench.py --records 2000000 --match-every 100 --layout spread
    python3 bench/stream_filter_bench.py --records 2000000 --match-every 100 --layout clustered

It starts a lavinpy (or use --uri), publishes ``--records`` messages to a new stream, every
``--match-every``-th tagged ``x-stream-filter-value: rare`` (``spread``) or the same number of tagged
messages in one stretch in the middle (``clustered``), the last message always tagged, so the
filtered consumer has reached the end when it gets it. Then, over TCP with the same client, one
consumer reads everything from ``first`` and one reads from ``first`` with ``x-stream-filter: rare``;
each is timed from basic.consume until its last message arrived: wall time, and the broker's and
the client's CPU time (user + system, from /proc), since the machine may be shared and wall time
then says little. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from pamqp import commands  # noqa: E402

from lavinpy.wire.client_blocking import AMQPParams, BlockingConnection  # noqa: E402
from lavinpy.wire.properties import encode_properties  # noqa: E402
from lavinpy.wire.writer import basic_ack, content_frames, method_frame  # noqa: E402

STREAM = "filter-bench"
FRAME_HEADER = 2


def broker_cpu(pid: int) -> float:
    """User + system CPU seconds of a process and its children that were waited for."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def client_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def start_lavinpy(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    from tests.helpers import free_ports
    port, http_port, metrics_port = free_ports(3)
    proc = subprocess.Popen([sys.executable, "-m", "lavinpy", "--data-dir", str(workdir / "data"), "--amqp-port",
                             str(port), "--http-port", str(http_port), "--prometheus-port", str(metrics_port),
                             "--mqtt-port", "0", "--log-level", "warning"], cwd=workdir, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    url = f"amqp://guest:guest@127.0.0.1:{port}/%2F"
    deadline = time.monotonic() + 30
    while True:
        try:
            BlockingConnection(AMQPParams.from_url(url)).open().close()
            return proc, url
        except Exception:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise
            time.sleep(0.2)


def tagged_offsets(records: int, every: int, layout: str) -> set[int]:
    """0-based indexes of the tagged messages; the last one always."""
    count = max(records // every, 1)
    if layout == "spread":
        tagged = set(range(every - 1, records, every))
    else:
        start = (records - count) // 2
        tagged = set(range(start, start + count - 1))
    tagged.add(records - 1)
    return tagged


def publish(url: str, records: int, tagged: set[int], body_size: int) -> float:
    conn = BlockingConnection(AMQPParams.from_url(url)).open()
    ch = conn.open_channel()
    conn.call(ch, commands.Queue.Declare(queue=STREAM, durable=True, arguments={"x-queue-type": "stream"}),
              commands.Queue.DeclareOk)
    conn.call(ch, commands.Confirm.Select(), commands.Confirm.SelectOk)
    body = b"x" * body_size
    plain = b"".join([method_frame(ch, commands.Basic.Publish(exchange="", routing_key=STREAM)),
                      *content_frames(ch, encode_properties(commands.Basic.Properties(delivery_mode=2)), body,
                                      conn.frame_max)])
    rare_props = encode_properties(commands.Basic.Properties(delivery_mode=2,
                                                             headers={"x-stream-filter-value": "rare"}))
    rare = b"".join([method_frame(ch, commands.Basic.Publish(exchange="", routing_key=STREAM)),
                     *content_frames(ch, rare_props, body, conn.frame_max)])
    started = time.perf_counter()
    batch: list[bytes] = []
    for i in range(records):
        batch.append(rare if i in tagged else plain)
        if len(batch) == 5000:
            conn.send(b"".join(batch))
            batch.clear()
            conn.read_frames(0)  # confirms: read so that neither side's buffers fill
    if batch:
        conn.send(b"".join(batch))
    # everything confirmed: a declare answers after the publishes before it were handled
    while True:
        ok = conn.call(ch, commands.Queue.Declare(queue=STREAM, durable=True, passive=True,
                                                  arguments={"x-queue-type": "stream"}), commands.Queue.DeclareOk)
        if ok.message_count >= records:
            break
        time.sleep(0.2)
    elapsed = time.perf_counter() - started
    conn.close()
    return elapsed


def consume(url: str, expected: int, arguments: dict, broker_pid: int | None, prefetch: int) -> dict:
    conn = BlockingConnection(AMQPParams.from_url(url)).open()
    ch = conn.open_channel()
    conn.call(ch, commands.Basic.Qos(prefetch_count=prefetch), commands.Basic.QosOk)
    broker_before = broker_cpu(broker_pid) if broker_pid else 0.0
    client_before = client_cpu()
    started = time.perf_counter()
    conn.call(ch, commands.Basic.Consume(queue=STREAM, arguments={"x-stream-offset": "first", **arguments}),
              commands.Basic.ConsumeOk)
    received = acked = 0
    step = max(prefetch // 2, 1)
    while received < expected:
        for ftype, _channel, _payload in conn.read_frames(30):
            if ftype == FRAME_HEADER:
                received += 1
        if received - acked >= step or received >= expected:
            conn.send(basic_ack(ch, received, True))
            acked = received
    wall = time.perf_counter() - started
    result = {"messages": received, "wall_s": round(wall, 3), "client_cpu_s": round(client_cpu() - client_before, 3)}
    if broker_pid:
        result["broker_cpu_s"] = round(broker_cpu(broker_pid) - broker_before, 3)
    conn.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uri", help="broker URL (default: a lavinpy started here; its CPU is measured)")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--match-every", type=int, default=100, help="1 in N messages matches (default 100: 1 %%)")
    parser.add_argument("--layout", choices=("spread", "clustered"), default="spread")
    parser.add_argument("--size", type=int, default=64, help="body bytes")
    parser.add_argument("--prefetch", type=int, default=1000)
    args = parser.parse_args()
    proc = None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            if args.uri:
                url, pid = args.uri, None
            else:
                proc, url = start_lavinpy(Path(tmp))
                pid = proc.pid
            tagged = tagged_offsets(args.records, args.match_every, args.layout)
            publish_s = publish(url, args.records, tagged, args.size)
            unfiltered = consume(url, args.records, {}, pid, args.prefetch)
            filtered = consume(url, len(tagged), {"x-stream-filter": "rare"}, pid, args.prefetch)
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(30)
    out = {"records": args.records, "matches": len(tagged), "layout": args.layout, "body": args.size,
           "publish_s": round(publish_s, 1), "unfiltered": unfiltered, "filtered": filtered,
           "wall_ratio": round(unfiltered["wall_s"] / max(filtered["wall_s"], 1e-9), 1)}
    if pid:
        out["broker_cpu_ratio"] = round(unfiltered["broker_cpu_s"] / max(filtered["broker_cpu_s"], 1e-3), 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
