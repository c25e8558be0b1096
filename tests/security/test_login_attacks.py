"""Login attacks against a running broker: wrong bcrypt passwords do not stall other clients, a
pipelining client after failed logins gets 403 (never 503) and then a working connection, the login
throttle covers the HTTP API and is shared with AMQP."""

from __future__ import annotations

import asyncio
import base64
import select
import socket
import threading
import time
from typing import Any

import aiohttp
import bcrypt
import pika
import pytest
from pamqp import commands

from lavinpy.broker.access import login_throttle
from lavinpy.wire import writer
from tests.e2e.conftest import LocalBroker
from tests.e2e.rawamqp import PROTOCOL_HEADER, RawAMQP

CLIENT_PROPERTIES: dict[str, Any] = {"product": "attack-suite"}


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def _start_ok(user: str, password: str) -> bytes:
    return writer.method_frame(0, commands.Connection.StartOk(client_properties=CLIENT_PROPERTIES, mechanism="PLAIN",
                                                             response=f"\0{user}\0{password}", locale="en_US"))


def _pipelined_login(broker: LocalBroker, password: str) -> tuple[RawAMQP, Any]:
    """StartOk, TuneOk and Open in one write after connection.start; the first answer."""
    c = RawAMQP(broker.host, broker.port)
    c.send_raw(PROTOCOL_HEADER)
    c.expect(commands.Connection.Start, 0)
    c.send_raw(_start_ok("guest", password)
               + writer.method_frame(0, commands.Connection.TuneOk(channel_max=0, frame_max=131072, heartbeat=0))
               + writer.method_frame(0, commands.Connection.Open(virtual_host="/")))
    return c, c.recv(timeout=10)[1]


def test_pipelined_handshake_after_failed_logins_gets_403_then_a_connection(fresh_broker: LocalBroker) -> None:
    for _ in range(login_throttle.FREE_FAILURES + 3):  # into the throttle's delays
        c, answer = _pipelined_login(fresh_broker, "wrong")
        with c:
            assert isinstance(answer, commands.Connection.Close), answer
            assert answer.reply_code == 403, answer.reply_text
    c, answer = _pipelined_login(fresh_broker, "guest")
    with c:
        assert isinstance(answer, commands.Connection.Tune), answer
        c.expect(commands.Connection.OpenOk, 0)
        c.open_channel(1)
        c.send(1, commands.Queue.Declare(queue="", exclusive=True))
        c.expect(commands.Queue.DeclareOk, 1)


def test_http_logins_are_throttled_with_the_other_faces(fresh_broker: LocalBroker) -> None:
    url = f"{fresh_broker.http_url}/api/whoami"

    async def attempts() -> list[tuple[int, float]]:
        results = []
        async with aiohttp.ClientSession() as session:
            for user, password in [("nobody", "x")] * (login_throttle.FREE_FAILURES + 1) + [("guest", "guest")]:
                started = time.monotonic()
                async with session.get(url, headers=_basic(user, password)) as response:
                    await response.read()
                    results.append((response.status, time.monotonic() - started))
        return results

    results = asyncio.run(attempts())
    free = login_throttle.FREE_FAILURES
    assert [status for status, _ in results] == [401] * (free + 1) + [200]
    assert results[free][1] >= 0.9 * login_throttle.BASE_DELAY  # the fourth failure waits
    assert results[free + 1][1] >= 0.9 * 2 * login_throttle.BASE_DELAY  # and so does the right password
    # Shared with AMQP, and guest's good login did not wipe the failures of another name.
    with RawAMQP(fresh_broker.host, fresh_broker.port) as c:
        c.send_raw(PROTOCOL_HEADER)
        c.expect(commands.Connection.Start, 0)
        started = time.monotonic()
        c.send_raw(_start_ok("guest", "guest"))
        c.expect(commands.Connection.Tune, 0)
        assert time.monotonic() - started >= 0.9 * 2 * login_throttle.BASE_DELAY


def _attack(broker: LocalBroker, user: str, rate: float, stop: threading.Event, answers: list[bytes]) -> None:
    """Wrong-password logins at ``rate`` per second, each on a new connection (not waiting for the
    answers, as a guesser would); connections are dropped after 5 s."""
    open_socks: list[tuple[float, socket.socket]] = []
    next_at = time.monotonic()
    i = 0
    while not stop.is_set():
        now = time.monotonic()
        if now >= next_at:
            next_at += 1 / rate
            i += 1
            try:
                sock = socket.create_connection((broker.host, broker.port), timeout=2)
                sock.sendall(PROTOCOL_HEADER + _start_ok(user, f"guess{i}"))
                sock.setblocking(False)
                open_socks.append((now, sock))
            except OSError:
                pass
        readable, _, _ = select.select([s for _, s in open_socks], [], [], 0.005) if open_socks else ([], [], [])
        for sock in readable:
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if data:
                answers.append(data)
        for entry in [e for e in open_socks if now - e[0] > 5.0]:
            entry[1].close()
            open_socks.remove(entry)
        if not open_socks:
            time.sleep(0.005)
    for _, sock in open_socks:
        sock.close()


def _confirm_latencies(channel: Any, seconds: float) -> list[float]:
    latencies = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.perf_counter()
        channel.basic_publish("", "confirms", b"x" * 100)  # returns once the broker confirmed it
        latencies.append(time.perf_counter() - started)
    return sorted(latencies)


@pytest.mark.timing
def test_wrong_bcrypt_logins_do_not_stall_publisher_confirms(fresh_broker: LocalBroker) -> None:
    hashed = bcrypt.hashpw(b"secret", bcrypt.gensalt(12, b"2a")).decode()  # LavinMQ's cost

    async def add_user() -> None:
        body = {"password_hash": hashed, "hashing_algorithm": "lavinmq_bcrypt", "tags": ""}
        async with (aiohttp.ClientSession(headers=_basic("guest", "guest")) as session,
                    session.put(f"{fresh_broker.http_url}/api/users/bob", json=body) as response):
            assert response.status in (201, 204), await response.text()
    asyncio.run(add_user())

    connection = pika.BlockingConnection(pika.URLParameters(fresh_broker.url))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("confirms", auto_delete=True)
    quiet = _confirm_latencies(channel, 1.0)
    stop = threading.Event()
    answers: list[bytes] = []
    attacker = threading.Thread(target=_attack, args=(fresh_broker, "bob", 20.0, stop, answers), daemon=True)
    attacker.start()
    try:
        time.sleep(0.5)
        attacked = _confirm_latencies(channel, 4.0)
    finally:
        stop.set()
        attacker.join(10)
    connection.close()
    p99 = attacked[int(len(attacked) * 0.99)]
    print(f"publisher confirms: quiet p99 {quiet[int(len(quiet) * 0.99)] * 1000:.1f} ms, "
          f"under 20 wrong bcrypt logins/s p99 {p99 * 1000:.1f} ms, max {attacked[-1] * 1000:.1f} ms "
          f"({len(attacked)} confirms, {len(answers)} refusals read)")
    assert answers  # the guesses were answered (refused), not ignored
    assert p99 < 0.2, (p99, attacked[-1])
