"""Messages per second over a federation link: an exchange link and a queue link, lavinpy -> lavinpy and
RabbitMQ -> lavinpy, beside RabbitMQ's own federation (RabbitMQ -> RabbitMQ) on the same machine. Not a test.

Every broker is started here on free ports: two lavinpy processes (default settings, fsync always) and,
when rabbitmq-server is installed, two private RabbitMQ nodes with rabbitmq_federation. The links are
defined as an operator would (upstream parameter and policy on the downstream, defaults: ack-mode
on-confirm, prefetch-count 1000), then measured:

- exchange link: --count persistent messages of --size bytes published to the upstream exchange (no
  confirms, as fast as the publisher goes); the rate is count / (last message in the downstream queue -
  first publish). The publisher's own rate is printed too: a link cannot be measured above it.
- queue link: --count persistent messages wait in the upstream queue; a consumer (auto-ack) is attached
  to the downstream queue; the rate is count / (last message consumed downstream - consumer attached).
  For a lavinpy downstream (where the link runs) its CPU time per message over that window is printed
  too (utime + stime of the process): on a shared machine it says more than the rate.

The setups run in turn, --rounds times, in a rotating order (the machine may be shared: a slow moment
then hits each setup once), and the median of each is printed.

    python3 bench/federation_bench.py                     # all setups, 20000 messages, 3 rounds
    python3 bench/federation_bench.py --count 50000 --rounds 5 --only lavinpy-lavinpy
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import pika  # noqa: E402

from tests.e2e.conftest import LocalBroker  # noqa: E402
from tests.e2e.rabbitmq_node import RabbitNode  # noqa: E402
from tests.helpers import http_request  # noqa: E402

Broker = Any  # a LocalBroker or a RabbitNode: url_for, http_url


def _url(broker: Broker) -> str:
    return broker.url_for("guest", "guest", "/")


def _ok(broker: Broker, method: str, path: str, body: Any = None) -> Any:
    status, reply, _ = http_request(broker.http_url, method, path, body)
    if status not in (200, 201, 204):
        raise RuntimeError(f"{method} {path}: {status} {reply}")
    return reply


def _wait(check: Callable[[], bool], what: str, timeout: float = 60.0, every: float = 0.005) -> float:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(every)
    return time.perf_counter()


def _count(ch: Any, queue: str) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


def _federate(up: Broker, down: Broker, name: str, apply_to: str) -> None:
    _ok(down, "PUT", f"/api/parameters/federation-upstream/%2F/{name}", {"value": {"uri": _url(up)}})
    _ok(down, "PUT", f"/api/policies/%2F/{name}", {"pattern": f"^{name}$", "apply-to": apply_to,
                                                   "definition": {"federation-upstream": name}})


def _unfederate(down: Broker, name: str) -> None:
    _ok(down, "DELETE", f"/api/policies/%2F/{name}")
    _ok(down, "DELETE", f"/api/parameters/federation-upstream/%2F/{name}")


def exchange_link(up: Broker, down: Broker, count: int, size: int) -> tuple[float, float]:
    """(link rate, publisher rate) in messages per second."""
    name = f"fx-{uuid.uuid4().hex[:8]}"
    dconn = pika.BlockingConnection(pika.URLParameters(_url(down)))
    dch = dconn.channel()
    dch.exchange_declare(name, "fanout", durable=True)
    dch.queue_declare(name, durable=True)
    dch.queue_bind(name, name, "")
    uconn = pika.BlockingConnection(pika.URLParameters(_url(up)))
    uch = uconn.channel()
    uch.exchange_declare(name, "fanout", durable=True)
    _federate(up, down, name, "exchanges")

    def bound() -> bool:  # the link's queue bound upstream: what is published now reaches it
        return any(b["source"] == name for b in _ok(up, "GET", "/api/bindings/%2F"))
    _wait(bound, "the link's binding upstream", every=0.1)
    body, props = b"x" * size, pika.BasicProperties(delivery_mode=2)
    started = time.perf_counter()
    for _ in range(count):
        uch.basic_publish(name, "", body, props)
    published = time.perf_counter()
    finished = _wait(lambda: _count(dch, name) >= count, "the messages downstream", every=0.02)
    _unfederate(down, name)
    uch.exchange_delete(name)
    dch.queue_delete(name)
    dch.exchange_delete(name)
    uconn.close()
    dconn.close()
    return count / (finished - started), count / (published - started)


def _cpu_seconds(broker: Broker) -> float | None:
    """utime + stime of a lavinpy broker's process (None for another broker)."""
    if not isinstance(broker, LocalBroker):
        return None
    fields = Path(f"/proc/{broker.pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def queue_link(up: Broker, down: Broker, count: int, size: int) -> tuple[float, float | None]:
    """(link rate in messages per second: count waiting upstream, consumed downstream; the downstream's CPU
    µs per message, None when it is not lavinpy)."""
    name = f"fq-{uuid.uuid4().hex[:8]}"
    uconn = pika.BlockingConnection(pika.URLParameters(_url(up)))
    uch = uconn.channel()
    uch.queue_declare(name, durable=True)
    body, props = b"x" * size, pika.BasicProperties(delivery_mode=2)
    for _ in range(count):
        uch.basic_publish("", name, body, props)
    _wait(lambda: _count(uch, name) >= count, "the messages upstream", every=0.05)
    dconn = pika.BlockingConnection(pika.URLParameters(_url(down)))
    dch = dconn.channel()
    dch.queue_declare(name, durable=True)
    _federate(up, down, name, "queues")
    time.sleep(2.0)  # the link up (it moves nothing without a consumer downstream)
    got = [0]

    def on_message(_ch: Any, _method: Any, _props: Any, _body: bytes) -> None:
        got[0] += 1
    dch.basic_qos(prefetch_count=1000)
    dch.basic_consume(name, on_message, auto_ack=True)
    cpu_before = _cpu_seconds(down)
    started = time.perf_counter()
    deadline = time.monotonic() + 120
    while got[0] < count:
        dconn.process_data_events(0.05)
        if time.monotonic() > deadline:
            raise RuntimeError(f"queue link: {got[0]} of {count} arrived")
    finished = time.perf_counter()
    cpu_after = _cpu_seconds(down)
    dconn.close()
    _unfederate(down, name)
    uch.queue_delete(name)
    uconn.close()
    cleanup = pika.BlockingConnection(pika.URLParameters(_url(down)))
    cleanup.channel().queue_delete(name)
    cleanup.close()
    cpu = None if cpu_before is None or cpu_after is None else (cpu_after - cpu_before) * 1e6 / count
    return count / (finished - started), cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--link", action="append", choices=("exchange", "queue"), help="a link to measure "
                        "(repeatable; default both)")
    parser.add_argument("--only", action="append", help="a setup to run (repeatable): lavinpy-lavinpy, "
                        "rabbitmq-lavinpy, rabbitmq-rabbitmq")
    args = parser.parse_args()
    kinds = set(args.link or ["exchange", "queue"])
    with tempfile.TemporaryDirectory() as tmp:
        started: list[Any] = []
        lock = threading.Lock()

        def lavinpy(name: str) -> LocalBroker:
            broker = LocalBroker(Path(tmp, name))
            broker.start()
            with lock:
                started.append(broker)
            _ok(broker, "PUT", "/api/global-parameters/cluster_name", {"name": "cluster_name", "value": name})
            return broker

        def rabbit(name: str) -> RabbitNode:
            node = RabbitNode(Path(tmp, name))
            node.plugins.append("rabbitmq_federation")
            node.start()
            with lock:
                started.append(node)
            return node

        try:
            wanted = set(args.only or ["lavinpy-lavinpy", "rabbitmq-lavinpy", "rabbitmq-rabbitmq"])
            setups: dict[str, tuple[Broker, Broker]] = {}
            if wanted & {"lavinpy-lavinpy", "rabbitmq-lavinpy"}:
                lp_up, lp_down = lavinpy("lp-up"), lavinpy("lp-down")
                setups["lavinpy-lavinpy"] = (lp_up, lp_down)
            if wanted & {"rabbitmq-lavinpy", "rabbitmq-rabbitmq"} and shutil.which("rabbitmq-server") is not None:
                rq_up = rabbit("rq-up")
                if "rabbitmq-lavinpy" in setups or "rabbitmq-lavinpy" in wanted:
                    setups["rabbitmq-lavinpy"] = (rq_up, lp_down)
                if "rabbitmq-rabbitmq" in wanted:
                    setups["rabbitmq-rabbitmq"] = (rq_up, rabbit("rq-down"))
            order = [s for s in ("lavinpy-lavinpy", "rabbitmq-lavinpy", "rabbitmq-rabbitmq")
                     if s in setups and s in wanted]
            results: dict[str, dict[str, list[float]]] = {s: {"exchange": [], "publisher": [], "queue": [],
                                                              "queue_cpu": []} for s in order}
            for r in range(args.rounds):
                for setup in order[r % len(order):] + order[:r % len(order)]:  # rotated each round
                    up, down = setups[setup]
                    link = publisher = queue = 0.0
                    cpu: float | None = None
                    if "exchange" in kinds:
                        link, publisher = exchange_link(up, down, args.count, args.size)
                    if "queue" in kinds:
                        queue, cpu = queue_link(up, down, args.count, args.size)
                    results[setup]["exchange"].append(link)
                    results[setup]["publisher"].append(publisher)
                    results[setup]["queue"].append(queue)
                    if cpu is not None:
                        results[setup]["queue_cpu"].append(cpu)
                    print(f"round {r + 1} {setup:18} exchange link {link:8,.0f} msg/s (publisher {publisher:,.0f})"
                          f"   queue link {queue:8,.0f} msg/s"
                          + (f" ({cpu:.0f} µs CPU/msg downstream)" if cpu is not None else ""), flush=True)
            print(f"\nmedians of {args.rounds} rounds, {args.count} persistent messages of {args.size} B, "
                  "ack-mode on-confirm, prefetch-count 1000:")
            for setup in order:
                res = results[setup]
                print(f"  {setup:18} exchange link {statistics.median(res['exchange']):8,.0f} msg/s   "
                      f"queue link {statistics.median(res['queue']):8,.0f} msg/s   "
                      f"(publisher {statistics.median(res['publisher']):,.0f} msg/s)"
                      + (f"   queue link downstream CPU {statistics.median(res['queue_cpu']):.0f} µs/msg"
                         if res["queue_cpu"] else ""))
        finally:
            for broker in reversed(started):
                try:
                    broker.stop()
                except BaseException as e:  # a lavinpy stop fails the way a test fails: report it, go on
                    print(f"stopping {broker}: {e}", file=sys.stderr)


if __name__ == "__main__":
    main()
