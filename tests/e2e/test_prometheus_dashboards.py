"""RabbitMQ's "RabbitMQ-Overview" Grafana dashboard, and lavinpy's own, against lavinpy through a
real Prometheus.

Debian's ``prometheus`` scrapes a lavinpy under load (a pika publisher, poller and churner, an
aio-pika consumer) every second with ``?prefix=rabbitmq``, with the scrape config of
docs/grafana/README.md; then each panel's queries (tests/e2e/rabbitmq_overview_queries.py, copied
from RabbitMQ's dashboard, and docs/grafana/lavinpy.json) go through Prometheus's HTTP API with the
dashboards' variables filled as Grafana fills them. Every query must return data: an empty result
is a blank panel.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pika
import pytest

from tests.helpers import free_port

from .conftest import REPO_ROOT, LocalBroker, lavinpy_only
from .rabbitmq_overview_queries import OVERVIEW_PANELS

PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    lavinpy_only("scrapes the Prometheus endpoint of a lavinpy started by the tests"),
    pytest.mark.skipif(PROMETHEUS is None, reason="the prometheus binary (Debian's prometheus package) is not "
                                                  "installed"),
]

SCRAPE_INTERVAL = "1s"
# Grafana's $__rate_interval for a 1 s scrape interval: four scrape intervals.
RATE_INTERVAL = "4s"
# The dashboard's time range ($__range), short enough for the seconds of data this test has.
RANGE = "30s"
DEADLINE = 35.0  # seconds of load before the empty panels are reported
OWN_DASHBOARD = REPO_ROOT / "docs" / "grafana" / "lavinpy.json"


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


class Prometheus:
    """A prometheus server of the test's own, scraping one target."""

    def __init__(self, workdir: Path, target: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = workdir / "prometheus.yml"
        # The scrape config the README shows: the prefix gives RabbitMQ's names.
        config.write_text(f"""global:
  scrape_interval: {SCRAPE_INTERVAL}
  evaluation_interval: {SCRAPE_INTERVAL}
scrape_configs:
  - job_name: lavinpy
    metrics_path: /metrics
    params:
      prefix: [rabbitmq]
    static_configs:
      - targets: ["{target}"]
  - job_name: lavinpy-detailed
    metrics_path: /metrics/detailed
    params:
      prefix: [rabbitmq]
      family: [queue_coarse_metrics, queue_metrics, queue_delivery_metrics]
    static_configs:
      - targets: ["{target}"]
""")
        self.log = workdir / "prometheus.log"
        assert PROMETHEUS is not None
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                pytest.fail(f"prometheus did not become ready:\n{self.log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.2)

    def query(self, expr: str) -> list[dict]:
        answer = _get_json(self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        assert answer["status"] == "success", (expr, answer)
        return answer["data"]["result"]

    def target_health(self) -> list[str]:
        targets = _get_json(self.url + "/api/v1/targets")["data"]["activeTargets"]
        return sorted(f"{t['health']} {t.get('lastError', '')}".strip() for t in targets)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


class Load:
    """Traffic that gives every panel something to show: confirmed publishes of several sizes,
    unroutable ones (returned and dropped), manual- and auto-ack consumers with requeues, basic.get
    with and without acks and on an empty queue, and connection, channel and queue churn."""

    SIZES = (40, 400, 4_000, 40_000)

    def __init__(self, broker: LocalBroker) -> None:
        self.url = broker.url
        tag = uuid.uuid4().hex[:8]
        self.manual, self.auto, self.polled, self.empty, self.dead = (
            f"dash-{kind}-{tag}" for kind in ("manual", "auto", "polled", "empty", "dead"))
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._guard, args=(f,), daemon=True)
                        for f in (self._publish_and_poll, self._consume)]

    def start(self) -> None:
        conn = pika.BlockingConnection(pika.URLParameters(self.url))
        ch = conn.channel()
        # Persistent messages on a durable queue: their confirms wait for the store's fsync.
        ch.queue_declare(self.manual, durable=True)
        for queue in (self.auto, self.empty, self.dead):
            ch.queue_declare(queue)
        ch.queue_declare(self.polled, arguments={"x-dead-letter-exchange": "",
                                                 "x-dead-letter-routing-key": self.dead})
        conn.close()
        for thread in self.threads:
            thread.start()

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(15)
        conn = pika.BlockingConnection(pika.URLParameters(self.url))
        ch = conn.channel()
        for queue in (self.manual, self.auto, self.polled, self.empty, self.dead):
            ch.queue_delete(queue)
        conn.close()

    def _guard(self, work) -> None:
        try:
            work()
        except BaseException as e:  # reported by the test, not lost in a thread
            self.errors.append(e)
            self.stop.set()

    def _publish_and_poll(self) -> None:
        conn = pika.BlockingConnection(pika.URLParameters(self.url))
        ch = conn.channel()
        ch.confirm_delivery()
        n = 0
        while not self.stop.is_set():
            n += 1
            body = b"m" * self.SIZES[n % len(self.SIZES)]
            ch.basic_publish("", self.manual, body, pika.BasicProperties(delivery_mode=2))
            for queue in (self.auto, self.polled):
                ch.basic_publish("", queue, body)
            if n % 10 == 0:
                try:
                    ch.basic_publish("", "no-such-queue", b"r", mandatory=True)  # returned
                except pika.exceptions.UnroutableError:
                    pass
                ch.basic_publish("amq.direct", "nowhere", b"d")  # dropped
            method, _, _ = ch.basic_get(self.polled, auto_ack=False)
            if method is not None and n % 3 == 0:
                ch.basic_reject(method.delivery_tag, requeue=False)  # dead-lettered: rejected
            elif method is not None:
                ch.basic_ack(method.delivery_tag)
            ch.basic_get(self.polled, auto_ack=True)
            ch.basic_get(self.empty, auto_ack=True)  # nothing there: a get_empty
            if n % 5 == 0:  # churn: a connection, a channel and a queue come and go
                other = pika.BlockingConnection(pika.URLParameters(self.url))
                temp = other.channel()
                temp.queue_declare(f"dash-temp-{uuid.uuid4().hex[:8]}", exclusive=True)
                temp.close()
                other.close()
            time.sleep(0.02)
        conn.close()

    def _consume(self) -> None:
        asyncio.run(self._consume_async())

    async def _consume_async(self) -> None:
        connection = await aio_pika.connect(self.url)
        async with connection:
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=20)
            manual = await channel.get_queue(self.manual, ensure=False)
            auto = await channel.get_queue(self.auto, ensure=False)
            seen = 0

            async def on_manual(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                nonlocal seen
                seen += 1
                if seen % 7 == 0 and not message.redelivered:
                    await message.nack(requeue=True)  # comes back redelivered
                else:
                    await message.ack()

            async def on_auto(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                pass

            await manual.consume(on_manual)
            await auto.consume(on_auto, no_ack=True)
            while not self.stop.is_set():
                await asyncio.sleep(0.1)


@pytest.fixture
def prometheus(broker: LocalBroker, tmp_path: Path) -> Iterator[Prometheus]:
    server = Prometheus(tmp_path, f"{broker.host}:{broker.prometheus_port}")
    yield server
    server.close()


def _own_panels() -> list[tuple[str, list[str]]]:
    dashboard = json.loads(OWN_DASHBOARD.read_text())
    return [(panel["title"], [t["expr"] for t in panel["targets"]]) for panel in dashboard["panels"]
            if panel.get("targets")]


def _fill_own(expr: str, instance: str) -> str:
    return (expr.replace("${prefix}", "rabbitmq").replace("$instance", instance)
            .replace("$__rate_interval", RATE_INTERVAL))


def _fill(expr: str, cluster: str) -> str:
    """The dashboard's variables as Grafana sets them for one lavinpy node: no Kubernetes namespace
    (the label is absent, which matches ""), the aggregated endpoint (/metrics)."""
    return (expr.replace("$rabbitmq_cluster", cluster).replace("$namespace", "")
            .replace("$endpoint", "aggregated").replace("$__rate_interval", RATE_INTERVAL)
            .replace("$__range", RANGE))


def _first_value(result: list[dict]) -> float:
    return float(result[0]["value"][1])


def test_every_overview_panel_has_data_under_load(broker, prometheus):
    # pika logs each returned message as a warning; the returns are wanted here.
    logging.getLogger("pika.adapters.blocking_connection").setLevel(logging.ERROR)
    load = Load(broker)
    load.start()
    try:
        deadline = time.monotonic() + DEADLINE
        cluster = None
        while cluster is None and time.monotonic() < deadline:
            # Grafana's variable query: label_values(rabbitmq_identity_info, rabbitmq_cluster).
            identity = prometheus.query("rabbitmq_identity_info")
            cluster = identity[0]["metric"]["rabbitmq_cluster"] if identity else None
            time.sleep(0.5)
        assert cluster, f"no rabbitmq_identity_info scraped; targets: {prometheus.target_health()}"
        instance = identity[0]["metric"]["instance"]
        own = _own_panels()
        assert len(own) >= 10
        queries = [(f"RabbitMQ-Overview: {title}", _fill(expr, cluster)) for title, exprs in OVERVIEW_PANELS
                   for expr in exprs]
        queries += [(f"lavinpy: {title}", _fill_own(expr, instance)) for title, exprs in own for expr in exprs]
        empty: list[tuple[str, str]] = []
        while time.monotonic() < deadline:
            assert not load.errors, load.errors
            empty = [(title, expr) for title, expr in queries if not prometheus.query(expr)]
            if not empty:
                break
            time.sleep(1)
        assert prometheus.target_health() == ["up", "up"]
        panels = len(OVERVIEW_PANELS) + len(own)
        with_data = panels - len({title for title, _ in empty})
        assert not empty, f"{with_data} of {panels} panels have data; empty queries:\n" + "\n".join(
            f"{title}: {expr[:150]}" for title, expr in empty)
        # Data, and the right data: traffic shows as traffic.
        by_title = dict(OVERVIEW_PANELS)
        for title in ("Incoming messages / s", "Publishers", "Consumers", "Messages delivered / s",
                      "Messages redelivered / s", "Polling operations that yield no result / s",
                      "Channels opened / s", "Connections closed / s", "Queues created / s", "Avg Size",
                      "Messages confirmed to publishers / s"):
            value = _first_value(prometheus.query(_fill(by_title[title][0], cluster)))
            assert value > 0, (title, value)
        own_by_title = dict(own)
        for title, target in (("Dead-lettered / s per queue and reason", 0), ("Dead-lettered / s by reason", 1),
                              ("Flushes / s", 0), ("Deliveries / s per queue", 0), ("CPU", 0)):
            value = _first_value(prometheus.query(_fill_own(own_by_title[title][target], instance)))
            assert value > 0, (title, value)
    finally:
        load.close()
    assert not load.errors, load.errors
