"""A real Celery worker whose task queue is a quorum queue (``x-queue-type: quorum`` in ``task_queues``),
against lavinpy: the worker declares its queues at start-up as Celery does against RabbitMQ 4 (with
quorum queues it also sets up kombu's native delayed delivery: 28 quorum queues with dead-letter
chains, at-least-once and reject-publish), and one task makes the round trip.

kombu ships no tests of quorum queues, and Celery's own (t/smoke/tests/quorum_queues) need Docker
containers of RabbitMQ, so a worker in a subprocess stands in for them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import urllib.parse
from pathlib import Path

import pytest

from . import uid
from .conftest import REPO_ROOT, http_call

celery = pytest.importorskip("celery")

APP = """
from kombu import Queue

from celery import Celery

app = Celery("quorum_tasks", broker={broker!r}, backend="rpc://")
app.conf.update(
    task_queues=[Queue({queue!r}, queue_arguments={{"x-queue-type": "quorum"}})],
    task_default_queue={queue!r},
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(name="quorum_tasks.add")
def add(x, y):
    return x + y
"""


def test_celery_worker_round_trip_on_a_quorum_queue(broker, clients, tmp_path: Path) -> None:
    queue = clients.track_queue(uid("celery-qq"))
    (tmp_path / "quorum_tasks.py").write_text(textwrap.dedent(APP.format(broker=broker.url, queue=queue)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO_ROOT)])}
    log = tmp_path / "worker.log"
    with log.open("w") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "quorum_tasks", "worker", "-Q", queue, "--pool", "solo",
             "--concurrency", "1", "--without-gossip", "--without-mingle", "--without-heartbeat",
             "--loglevel", "INFO"], cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    sys.path.insert(0, str(tmp_path))
    try:
        import quorum_tasks  # the same app, from the module the worker runs

        result = quorum_tasks.add.delay(2, 3)
        assert result.get(timeout=60) == 5, log.read_text()
        status, info, _ = http_call(broker, "GET", f"/api/queues/%2F/{urllib.parse.quote(queue, safe='')}")
        assert status == 200 and info["type"] == "quorum", info
        status, listed, _ = http_call(broker, "GET", "/api/queues/%2F")
        # kombu's native delayed delivery: one quorum queue per level, TTLs of 1 s up to 2^27 s
        delayed = [q for q in listed if q["name"].startswith("celery_delayed_")]
        for q in delayed:
            clients.track_queue(q["name"])
        assert len(delayed) == 28 and all(q["type"] == "quorum" for q in delayed), delayed
        assert {q["arguments"].get("x-dead-letter-strategy") for q in delayed} == {"at-least-once"}
        status, exchanges, _ = http_call(broker, "GET", "/api/exchanges/%2F")
        for exchange in exchanges:
            if exchange["name"].startswith("celery_delayed_"):
                clients.track_exchange(exchange["name"])
        assert "PRECONDITION_FAILED" not in log.read_text()
        assert worker.poll() is None, log.read_text()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("quorum_tasks", None)
        worker.terminate()
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
