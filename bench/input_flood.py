"""Another client's latency beside a client that floods the broker with small methods.

One client writes 256 KiB of methods at a time (basic.qos, passive queue.declares of a queue that
exists, or such declares each with a 98 KiB arguments table of 11,000 entries) without waiting for the
answers, and drains what comes back; beside it a second client makes round trips (basic.qos, its
qos-ok) and records each one's time. Prints the round trips' count, p50, p99 and max (while the
flood's reads are handled the other client waits), the broker's CPU and the rate of the flood's answers.

    python3 bench/input_flood.py --method qos --seconds 10 [--repo <tree>]

``--burst N`` instead writes N methods once, waits for their N answers and prints the broker's CPU a
method (what one such method holds the loop, whatever else runs on the machine).
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))
from bench_broker import REPO, BrokerProcess  # noqa: E402
from pamqp import commands, frame  # noqa: E402
from rawamqp import RawAMQP  # noqa: E402

FLOOD_BYTES = 256 * 1024


def one_frame(method: str) -> bytes:
    """One frame of ``method`` on channel 1."""
    if method == "qos":
        return frame.marshal(commands.Basic.Qos(prefetch_count=10), 1)
    if method == "table":
        arguments = {f"k{i}": i for i in range(11_000)}
        return frame.marshal(commands.Queue.Declare(queue="flood", passive=True, arguments=arguments), 1)
    return frame.marshal(commands.Queue.Declare(queue="flood", passive=True), 1)


def flood_write(method: str) -> bytes:
    """About FLOOD_BYTES of ``method`` frames (at least one)."""
    one = one_frame(method)
    return one * max(1, FLOOD_BYTES // len(one))


def flood(port: int, data: bytes, stop: threading.Event, answered: list[int]) -> None:
    """Writes ``data`` until ``stop``; ``answered[0]`` counts the bytes of the answers drained."""
    client = RawAMQP("127.0.0.1", port)
    client.handshake()
    client.open_channel()
    sock = client.sock

    def drain() -> None:
        sock.settimeout(0.5)
        while not stop.is_set():
            try:
                got = sock.recv(1 << 20)
                if not got:
                    return
                answered[0] += len(got)
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


def burst(port: int, method: str, count: int, cpu_seconds: Callable[[], float]) -> tuple[float, float]:
    """(wall seconds, broker CPU seconds) for ``count`` ``method`` frames written at once and answered."""
    client = RawAMQP("127.0.0.1", port)
    client.handshake()
    client.open_channel()
    answer = commands.Basic.QosOk if method == "qos" else commands.Queue.DeclareOk
    data = one_frame(method) * count
    wall0, cpu0 = time.perf_counter(), cpu_seconds()
    client.sock.sendall(data)
    for _ in range(count):
        client.expect(answer, 1)
    wall, cpu = time.perf_counter() - wall0, cpu_seconds() - cpu0
    client.close()
    return wall, cpu


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
    parser.add_argument("--method", choices=("qos", "declare", "table"), default="qos")
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--repo", type=Path, default=REPO, help="the tree whose broker runs")
    parser.add_argument("--no-flood", action="store_true", help="the round trips alone")
    parser.add_argument("--burst", type=int, default=0, help="write this many methods once: CPU a method")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProcess(Path(tmp), repo=args.repo)
        try:
            setup = RawAMQP("127.0.0.1", broker.amqp_port)
            setup.handshake()
            setup.open_channel()
            setup.call(1, commands.Queue.Declare(queue="flood"), commands.Queue.DeclareOk)
            setup.close()
            if args.burst:
                wall, cpu = burst(broker.amqp_port, args.method, args.burst, broker.cpu_seconds)
                print(f"{args.method}: {args.burst} written at once, answered in {wall * 1e3:.0f} ms, "
                      f"broker CPU {cpu / args.burst * 1e3:.2f} ms a method")
                return
            stop = threading.Event()
            answered = [0]
            flooder = threading.Thread(target=flood, args=(broker.amqp_port, flood_write(args.method), stop,
                                                           answered))
            if not args.no_flood:
                flooder.start()
                time.sleep(1.0)
            cpu0, answered0 = broker.cpu_seconds(), answered[0]
            times = sorted(ping(broker.amqp_port, args.seconds))
            cpu, flood_answers = broker.cpu_seconds() - cpu0, answered[0] - answered0
            stop.set()
            if not args.no_flood:
                flooder.join()
        finally:
            broker.stop()
    count = len(times)
    print(f"{args.method}{' (no flood)' if args.no_flood else ''}: {count} round trips, "
          f"p50 {times[count // 2] * 1e3:.2f} ms, p99 {times[int(count * 0.99)] * 1e3:.2f} ms, "
          f"max {times[-1] * 1e3:.2f} ms, broker CPU {cpu / args.seconds * 100:.0f} %, "
          f"the flood's answers {flood_answers / args.seconds / 1024:.1f} KiB/s")


if __name__ == "__main__":
    socket.setdefaulttimeout(30)
    main()
