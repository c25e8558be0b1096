"""Broker without pytest's fixtures: as a context manager, beside another broker, across a restart, after
its test process is killed, and from unittest."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
from pathlib import Path

import pika
import pytest

from lavinpy.testing import Broker, BrokerTestCase

DEFAULT_PORTS = {5672, 1883, 15672, 15692, 5671, 8883, 15671}
REPO = Path(__file__).resolve().parents[2]


def gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def hold_default_ports() -> list[socket.socket]:
    """Listeners on the default ports that are free, as a RabbitMQ of the user's would be (one already
    there does the same)."""
    held = []
    for port in sorted(DEFAULT_PORTS):
        sock = socket.socket()
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
            held.append(sock)
        except OSError:
            sock.close()
    return held


def test_context_manager_on_free_ports_beside_another_broker() -> None:
    held = hold_default_ports()
    with Broker() as first, Broker(mqtt=False) as second:
        ports = {first.amqp_port, first.http_port, first.mqtt_port, second.amqp_port, second.http_port}
        assert len(ports) == 5 and not ports & DEFAULT_PORTS
        assert second.mqtt_port == 0
        for broker in (first, second):
            connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
            connection.channel().queue_declare("here")
            connection.close()
            assert broker.queues() == ["here"]
            assert broker.data_dir.is_dir() and "lavinpy started" in broker.log
            assert broker.start_seconds is not None and broker.start_seconds < broker.start_timeout
        assert first.data_dir != second.data_dir
        workdir, pid = first.workdir, first.proc.pid if first.proc else 0
    assert workdir is not None and not workdir.exists()
    assert gone(pid, 1)
    for sock in held:
        sock.close()


def test_restart_keeps_the_data_dir_and_the_ports() -> None:
    with Broker(fsync="always") as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
        channel = connection.channel()
        channel.queue_declare("durable-work", durable=True)
        channel.basic_publish("", "durable-work", b"kept", pika.BasicProperties(delivery_mode=2))
        connection.close()
        port = broker.amqp_port
        broker.restart()
        assert broker.amqp_port == port
        assert [m.body for m in broker.get("durable-work")] == [b"kept"]


def test_the_broker_dies_with_a_killed_test_process_and_its_dir_goes_at_the_next_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A temp root of its own: a broker started meanwhile by another worker sweeps the shared one, and would
    # remove the dead run's directory before this test looks at it.
    root = tmp_path / "tmp"
    root.mkdir()
    script = textwrap.dedent("""
        import os, signal
        from lavinpy.testing import Broker
        broker = Broker().start()
        print(broker.proc.pid, broker.workdir, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)  # no atexit, no context manager exit
    """)
    env = {**os.environ, "TMPDIR": str(root),
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env,
                         cwd=tmp_path)
    assert run.returncode == -9, run.stderr
    pid, workdir = run.stdout.split()
    assert gone(int(pid), 10), "the kernel kills the broker with its parent"
    assert Path(workdir).parent == root and Path(workdir).exists()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    with Broker(mqtt=False):
        assert not Path(workdir).exists(), "the next broker removes a dead run's directory"


def test_unittest_test_case_gives_each_test_a_fresh_vhost() -> None:
    seen: list[str] = []

    class Orders(BrokerTestCase):
        def test_publish(self) -> None:
            self.assertEqual(self.vhost.queues(), [])
            connection = pika.BlockingConnection(pika.URLParameters(self.vhost))
            channel = connection.channel()
            channel.queue_declare("orders")
            channel.basic_publish("", "orders", b"one")
            connection.close()
            self.assertEqual(self.vhost.wait_for_messages("orders", 1), 1)
            seen.append(self.vhost.name)

        test_publish_again = test_publish

    result = unittest.TextTestRunner(stream=io.StringIO(), verbosity=0).run(
        unittest.defaultTestLoader.loadTestsFromTestCase(Orders))
    assert result.wasSuccessful(), result.errors + result.failures
    assert len(set(seen)) == 2
    assert not Orders.broker.running() and Orders.broker.workdir is None
