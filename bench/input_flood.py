"""Another client's latency beside a client that floods the broker with small methods.

One client writes 256 KiB of small methods at a time (basic.qos, or passive queue.declares of a queue
that exists) without waiting for the answers, and drains what comes back; beside it a second client
makes round trips (basic.qos, its qos-ok) and records each one's time. Prints the round trips' count,
p50, p99 and max: while the flood's reads are handled the other client waits.

    python3 bench/input_flood.py --method qos --seconds 10 [--repo <tree>]
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))
from bench_broker import REPO, BrokerProcess  # noqa: E402
from pamqp import commands, frame  # noqa: E402
from rawamqp import RawAMQP  # noqa: E402

FLOOD_BYTES = 256 * 1024


def flood_write(method: str) -> bytes:
    """About FLOOD_BYTES of ``method`` frames on channel 1."""
    if method == "qos":
        one = frame.marshal(commands.Basic.Qos(prefetch_count=10), 1)
    else:
        one = frame.marshal(commands.Queue.Declare(queue="flood", passive=True), 1)
    return one * (FLOOD_BYTES // len(one))


def flood(port: int, data: bytes, stop: threading.Event) -> None:
    client = RawAMQP("127.0.0.1", port)
    client.handshake()
    client.open_channel()
    sock = client.sock

    def drain() -> None:
        sock.settimeout(0.5)
        while not stop.is_set():
            try:
                if not sock.recv(1 << 20):
                    return
            except TimeoutError:
                continue
            except OSError:
                return

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        while not stop.is_set():
            sock.sendall(data)
    except OSError:
        pass
    reader.join()
    client.close()


def ping(port: int, seconds: float) -> list[float]:
    client = RawAMQP("127.0.0.1", port)
    client.handshake()
    client.open_channel()
    times = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        client.call(1, commands.Basic.Qos(prefetch_count=1), commands.Basic.QosOk)
        times.append(time.perf_counter() - t0)
        time.sleep(0.001)
    client.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--method", choices=("qos", "declare"), default="qos")
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--repo", type=Path, default=REPO, help="the tree whose broker runs")
    parser.add_argument("--no-flood", action="store_true", help="the round trips alone")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProcess(Path(tmp), repo=args.repo)
        try:
            setup = RawAMQP("127.0.0.1", broker.amqp_port)
            setup.handshake()
            setup.open_channel()
            setup.call(1, commands.Queue.Declare(queue="flood"), commands.Queue.DeclareOk)
            setup.close()
            stop = threading.Event()
            flooder = threading.Thread(target=flood, args=(broker.amqp_port, flood_write(args.method), stop))
            if not args.no_flood:
                flooder.start()
                time.sleep(1.0)
            cpu0 = broker.cpu_seconds()
            times = sorted(ping(broker.amqp_port, args.seconds))
            cpu = broker.cpu_seconds() - cpu0
            stop.set()
            if not args.no_flood:
                flooder.join()
        finally:
            broker.stop()
    count = len(times)
    print(f"{args.method}{' (no flood)' if args.no_flood else ''}: {count} round trips, "
          f"p50 {times[count // 2] * 1e3:.2f} ms, p99 {times[int(count * 0.99)] * 1e3:.2f} ms, "
          f"max {times[-1] * 1e3:.2f} ms, broker CPU {cpu / args.seconds * 100:.0f} %")


if __name__ == "__main__":
    socket.setdefaulttimeout(30)
    main()
