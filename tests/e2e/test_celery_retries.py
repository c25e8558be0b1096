"""A real Celery worker retrying a failing task with the broker's back-off on a quorum queue.

The task is ``acks_late`` and raises ``Reject(requeue=True)`` while it fails: the worker sends
basic.reject with requeue, which RabbitMQ 4.3 counts as a failed delivery, and the queue
(``x-delayed-retry-type: failed``, min 300 ms, multiplier 2) holds it 300 ms, then 600 ms, before the
third attempt succeeds. The attempts' times, written by the task, show the waits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from . import uid
from .conftest import REPO_ROOT, http_call, lavinpy_only

celery = pytest.importorskip("celery")
pytestmark = lavinpy_only("exponential delayed retries are lavinpy's")

APP = """
import json
import time

from kombu import Queue

from celery import Celery
from celery.exceptions import Reject

app = Celery("retry_tasks", broker={broker!r})
app.conf.update(
    task_queues=[Queue({queue!r}, queue_arguments={{
        "x-queue-type": "quorum", "x-delayed-retry-type": "failed", "x-delayed-retry-min": 300,
        "x-delayed-retry-multiplier": 2, "x-delivery-limit": 5}})],
    task_default_queue={queue!r},
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    worker_prefetch_multiplier=1,
)


@app.task(name="retry_tasks.flaky", bind=True, acks_late=True)
def flaky(self, log_path):
    with open(log_path, "a") as log:
        log.write(json.dumps(time.time()) + "\\n")
    with open(log_path) as log:
        attempts = len(log.readlines())
    if attempts < 3:
        raise Reject("not yet", requeue=True)
    return attempts
"""


def test_celery_task_retried_by_the_broker_with_backoff(broker, clients, tmp_path: Path) -> None:
    queue = clients.track_queue(uid("celery-retry"))
    (tmp_path / "retry_tasks.py").write_text(textwrap.dedent(APP.format(broker=broker.url, queue=queue)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO_ROOT)])}
    log = tmp_path / "worker.log"
    attempts = tmp_path / "attempts.log"
    with log.open("w") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "retry_tasks", "worker", "-Q", queue, "--pool", "solo",
             "--concurrency", "1", "--without-gossip", "--without-mingle", "--without-heartbeat",
             "--loglevel", "INFO"], cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    sys.path.insert(0, str(tmp_path))
    try:
        import retry_tasks  # the same app, from the module the worker runs

        retry_tasks.flaky.delay(str(attempts))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if attempts.exists() and len(attempts.read_text().splitlines()) >= 3 and "succeeded" in log.read_text():
                break
            assert worker.poll() is None, log.read_text()
            time.sleep(0.1)
        times = [json.loads(line) for line in attempts.read_text().splitlines()]
        assert len(times) == 3, (times, log.read_text())
        waits = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
        # The lower bounds are the back-off (300 ms, then doubled); a release that never came would leave
        # no third attempt. No upper bound: a loaded machine may stall either process for seconds.
        assert waits[0] >= 0.28 and waits[1] >= 0.58, (waits, log.read_text()[-3000:], broker.log[-3000:])
        status, info, _ = http_call(broker, "GET", f"/api/queues/%2F/{queue}")
        assert status == 200 and info["message_stats"]["delayed_retries"] == 2, info  # held twice by the broker
        assert "PRECONDITION_FAILED" not in log.read_text()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("retry_tasks", None)
        worker.terminate()
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
