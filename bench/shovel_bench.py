"""Messages moved per second by a lavinpy shovel (the engine as the broker runs it), queue to queue.
Not a test. Fills the source queue with --count persistent messages of --size bytes, then runs one
shovel (src-delete-after: queue-length) until the queue is moved, and prints the rate.

    python3 bench/shovel_bench.py                      # two lavinpy brokers started here (lavinpy -> lavinpy)
    python3 bench/shovel_bench.py --src amqp://guest:guest@127.0.0.1:5672/ \
        --dest amqp://guest:guest@127.0.0.1:5673/     # any brokers, e.g. RabbitMQ -> lavinpy
    python3 bench/shovel_bench.py --ack-mode on-publish --count 200000

For RabbitMQ's own shovel on the same queues, define it on the RabbitMQ node (rabbitmq_shovel plugin):
    rabbitmqctl set_parameter shovel bench '{"src-uri":"amqp://","src-queue":"shovel-bench-src",
        "dest-uri":"amqp://guest:guest@127.0.0.1:5673","dest-queue":"shovel-bench-dst",
        "src-delete-after":"queue-length"}'
and time how long the source queue takes to empty.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import pika  # noqa: E402

from lavinpy.shovel.component import LocalNode, ShovelComponent, Shovels  # noqa: E402

SRC, DST = "shovel-bench-src", "shovel-bench-dst"


def fill(url: str, count: int, size: int) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.queue_delete(SRC)
    ch.queue_declare(SRC, durable=True)
    ch.confirm_delivery()
    body = b"x" * size
    props = pika.BasicProperties(delivery_mode=2)
    for _ in range(count):
        ch.basic_publish("", SRC, body, props)  # each confirmed: slow, but not what is measured
    conn.close()


def reset_destination(url: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.queue_delete(DST)
    ch.queue_declare(DST, durable=True)
    conn.close()


async def move(src: str, dest: str, ack_mode: str, prefetch: int) -> float:
    shovels = Shovels(LocalNode("127.0.0.1", 5672, lambda _user: ""), "bench")  # URIs name their users
    done = asyncio.Event()
    shovels.on_finished = lambda _vhost, _name: done.set()
    shovels.start()
    started = time.perf_counter()
    component = ShovelComponent(shovels, lambda _vhost, _name: "guest")
    component.apply("/", "bench", {"src-uri": src, "src-queue": SRC, "dest-uri": dest,
                                   "dest-queue": DST, "src-delete-after": "queue-length",
                                   "ack-mode": ack_mode, "src-prefetch-count": prefetch})
    await done.wait()
    elapsed = time.perf_counter() - started
    await shovels.stop()
    return elapsed


def start_lavinpy(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    sys.path.insert(0, str(REPO_ROOT))
    from tests.helpers import free_ports
    port, http_port, metrics_port = free_ports(3)
    proc = subprocess.Popen([sys.executable, "-m", "lavinpy", "--data-dir", str(workdir / "data"), "--amqp-port",
                             str(port), "--http-port", str(http_port), "--prometheus-port", str(metrics_port),
                             "--mqtt-port", "0", "--log-level", "warning"], cwd=workdir, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"amqp://guest:guest@127.0.0.1:{port}/"
    deadline = time.monotonic() + 20
    while True:
        try:
            pika.BlockingConnection(pika.URLParameters(url)).close()
            return proc, url
        except pika.exceptions.AMQPConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", help="source broker URL (default: a lavinpy started here)")
    parser.add_argument("--dest", help="destination broker URL (default: a lavinpy started here)")
    parser.add_argument("--count", type=int, default=50000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--ack-mode", default="on-confirm", choices=("on-confirm", "on-publish", "no-ack"))
    parser.add_argument("--prefetch", type=int, default=1000)
    args = parser.parse_args()
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            src, dest = args.src, args.dest
            if src is None:
                Path(tmp, "src").mkdir()
                proc, src = start_lavinpy(Path(tmp, "src").resolve())
                procs.append(proc)
            if dest is None:
                Path(tmp, "dst").mkdir()
                proc, dest = start_lavinpy(Path(tmp, "dst").resolve())
                procs.append(proc)
            fill(src, args.count, args.size)
            reset_destination(dest)
            elapsed = asyncio.run(move(src, dest, args.ack_mode, args.prefetch))
            print(f"shovel {args.ack_mode}, prefetch {args.prefetch}: {args.count} messages of {args.size} B "
                  f"in {elapsed:.2f} s = {args.count / elapsed:,.0f} msg/s")
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(15)


if __name__ == "__main__":
    main()
