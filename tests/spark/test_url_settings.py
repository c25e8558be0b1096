"""The Spark source's url takes RabbitMQ's URI query keys for its connections: heartbeat,
connection_timeout, channel_max, frame_max and auth_mechanism, against a real lavinpy."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import pytest
from pamqp import commands

from lavinpy.spark.client import AMQPParams, Connection, ConnectionLost
from lavinpy.spark.options import OptionError, ReadOptions
from lavinpy.spark.publisher import ConfirmPublisher

from .conftest import EXTERNAL_URL, Broker

pytestmark = [pytest.mark.spark, pytest.mark.timeout(120)]


def with_query(url: str, query: str) -> str:
    return url.rstrip("/") + "/?" + query if url.endswith("/") else url + "?" + query


def test_a_heartbeat_keeps_a_connection_its_thread_leaves_alone_open(broker) -> None:
    """A task's thread busy elsewhere (Spark's JVM, a driver between micro-batches) for longer than
    two heartbeats: the connection's heartbeat thread keeps the broker from closing it."""
    conn = Connection(AMQPParams.from_url(with_query(broker.url, "heartbeat=1"))).open()
    try:
        assert conn.client is not None and conn.client.heartbeat == 1
        ch = conn.open_channel()
        time.sleep(3.5)  # the broker closes a connection silent for two heartbeats
        ok = conn.call(ch, commands.Queue.Declare(queue="", exclusive=True), commands.Queue.DeclareOk)
        assert ok.queue
    finally:
        conn.close()


def test_without_a_heartbeat_in_the_url_there_is_none(broker) -> None:
    conn = Connection(AMQPParams.from_url(broker.url)).open()
    try:
        assert conn.client is not None and conn.client.heartbeat == 0
    finally:
        conn.close()


@pytest.mark.skipif(bool(EXTERNAL_URL), reason="stops its own broker")
def test_a_silent_broker_ends_the_connection_after_two_heartbeats(tmp_path: Path) -> None:
    own = Broker(tmp_path)
    assert own.proc is not None
    conn = Connection(AMQPParams.from_url(with_query(own.url, "heartbeat=1"))).open()
    conn.open_channel()
    os.kill(own.proc.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(ConnectionLost, match="missed heartbeats from the broker"):
            while time.monotonic() - started < 10:
                conn.read_frames(0.5)
        assert time.monotonic() - started < 5
    finally:
        os.kill(own.proc.pid, signal.SIGCONT)
        conn.abort()
        own.close()


def test_connection_timeout_bounds_a_handshake_that_never_comes() -> None:
    with socket.socket() as silent:  # accepts TCP (the backlog) and never speaks AMQP
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        port = silent.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(ConnectionLost, match="timed out in the AMQP handshake"):
            Connection(AMQPParams.from_url(f"amqp://guest:guest@127.0.0.1:{port}/?connection_timeout=300")).open()
        assert time.monotonic() - started < 3  # not the url's 30 s timeout


def test_channel_max_and_frame_max_are_asked_for_and_kept(broker, admin) -> None:
    queue = f"settings-{time.monotonic_ns()}"
    admin.queue_declare(queue, durable=True)
    url = with_query(broker.url, "channel_max=2&frame_max=4096")
    conn = Connection(AMQPParams.from_url(url)).open()
    try:
        assert conn.client is not None and conn.client.channel_max == 2 and conn.frame_max == 4096
        assert conn.channels_left == 2
    finally:
        conn.close()
    body = bytes(range(256)) * 40  # 10 KB: three body frames at 4096
    with Connection(AMQPParams.from_url(url)).open() as conn:
        publisher = ConfirmPublisher(conn)
        publisher.publish("", queue, body)
        publisher.wait_for_confirms()
    _method, _props, got = admin.basic_get(queue, auto_ack=True)
    assert got == body


def test_auth_mechanism_picks_the_login(broker) -> None:
    conn = Connection(AMQPParams.from_url(with_query(broker.url, "auth_mechanism=external&auth_mechanism=amqplain")))
    with conn.open():
        assert conn.client is not None and conn.client.mechanism == "AMQPLAIN"
    with pytest.raises(Exception, match="does not offer SASL EXTERNAL"):
        Connection(AMQPParams.from_url(with_query(broker.url, "auth_mechanism=external"))).open()


def test_a_bad_setting_is_an_option_error_naming_it() -> None:
    with pytest.raises(OptionError, match="option url: heartbeat='often': expected a whole number"):
        ReadOptions.parse({"url": "amqp://127.0.0.1/?heartbeat=often", "queue": "q"})
