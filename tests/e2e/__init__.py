"""End-to-end tests: a real lavinpy process (or an external broker) driven by real AMQP clients.

Run against lavinpy (the fixtures start and stop the server):
    python -m pytest tests/e2e -q
Run the same tests against another broker, e.g. RabbitMQ, to prove they encode real AMQP behaviour:
    LAVINPY_TEST_URL=amqp://guest:guest@127.0.0.1:5672/ \
    LAVINPY_TEST_RABBITMQCTL="rabbitmqctl -n rabbit@localhost" python -m pytest tests/e2e -q
See conftest.py for what each variable enables.

Small helpers shared by the test modules live here.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from tests.helpers import poll_until


def uid(prefix: str = "t") -> str:
    """A name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def get_all(ch: BlockingChannel, queue: str, auto_ack: bool = True, limit: int = 100000
            ) -> list[tuple[Any, Any, bytes]]:
    """basic.get until get-empty; returns [(method, properties, body)]."""
    out = []
    while len(out) < limit:
        method, props, body = ch.basic_get(queue, auto_ack=auto_ack)
        if method is None:
            break
        out.append((method, props, body))
    return out


def bodies(messages: list[tuple[Any, Any, bytes]]) -> list[bytes]:
    return [m[2] for m in messages]


def consume(conn: BlockingConnection, ch: BlockingChannel, queue: str, n: int, timeout: float = 5.0,
            auto_ack: bool = False, **kwargs: Any) -> list[tuple[Any, Any, bytes]]:
    """Start a consumer, collect n deliveries (or what arrives before timeout), and cancel it.

    Unacked deliveries stay unacked; the consumer tag is in each method frame.
    """
    got: list[tuple[Any, Any, bytes]] = []

    def on_message(_ch: Any, method: Any, props: Any, body: bytes) -> None:
        got.append((method, props, body))

    tag = ch.basic_consume(queue, on_message, auto_ack=auto_ack, **kwargs)
    wait_until(conn, lambda: len(got) >= n, timeout)
    ch.basic_cancel(tag)
    return got


def rss_anon(pid: int) -> int:
    """A process's anonymous resident memory in bytes (what a broker's buffers cost)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc status")


def cpu_seconds(pid: int) -> float:
    """A process's CPU time so far (user + system, from /proc): what a piece of work cost the broker,
    whatever else the machine runs meanwhile."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def assert_witness_served(url: str, seconds: float = 1.0) -> None:
    """Another client (at ``url``) declares, publishes and gets round trips promptly meanwhile."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        q = ch.queue_declare(uid("witness"), exclusive=True).method.queue
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            started = time.monotonic()
            ch.basic_publish("", q, b"ping")
            method, _props, body = ch.basic_get(q, auto_ack=True)
            assert method is not None and body == b"ping"
            assert time.monotonic() - started < 1.0
    finally:
        conn.close()


def wait_until(conn: BlockingConnection, predicate: Callable[[], bool], timeout: float = 5.0,
               step: float = 0.05) -> bool:
    """Process the connection's events until predicate() is true (True) or timeout passes (False)."""
    return bool(poll_until(predicate, timeout, step, pause=lambda s: conn.process_data_events(time_limit=s)))


def settle(conn: BlockingConnection, seconds: float = 0.3) -> None:
    """Process events for a while (to prove that nothing more arrives)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)


def persistent(**kwargs: Any) -> pika.BasicProperties:
    return pika.BasicProperties(delivery_mode=2, **kwargs)


class _Closed:
    reply_code: int = 0
    reply_text: str = ""


@contextlib.contextmanager
def channel_closed(code: int, text_contains: str | None = None) -> Iterator[_Closed]:
    """The block must end with the broker closing the channel with this reply code.

    Asynchronous methods (publish, ack) only fail on the next synchronous call, so end the block with one
    (for example ch.basic_qos(prefetch_count=0)).
    """
    result = _Closed()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        yield result
    result.reply_code, result.reply_text = e.value.reply_code, e.value.reply_text
    assert e.value.reply_code == code, f"expected {code}, got {e.value.reply_code} {e.value.reply_text}"
    if text_contains is not None:
        assert text_contains in e.value.reply_text, e.value.reply_text


@contextlib.contextmanager
def connection_closed(code: int, text_contains: str | None = None) -> Iterator[_Closed]:
    """The block must end with the broker closing the connection with this reply code."""
    result = _Closed()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as e:
        yield result
    result.reply_code, result.reply_text = e.value.reply_code, e.value.reply_text
    assert e.value.reply_code == code, f"expected {code}, got {e.value.reply_code} {e.value.reply_text}"
    if text_contains is not None:
        assert text_contains in e.value.reply_text, e.value.reply_text
