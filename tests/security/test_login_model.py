"""The one login operation in process: the throttle counts attempts (in flight too), slow hashes are
checked off the event loop, unknown users take as long as known ones, bcrypt users are rehashed."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest
from pamqp import commands

from lavinpy.broker.access import login_throttle
from lavinpy.broker.access.login_throttle import LoginThrottle
from lavinpy.broker.broker import Broker
from lavinpy.broker.login import LoginOutcome, LoginRequest, Refusal
from lavinpy.config import Config
from lavinpy.mqtt import codec
from lavinpy.mqtt.connection import Effect as MQTTEffect
from lavinpy.mqtt.connection import MQTTConnection
from lavinpy.mqtt.sessions import MQTTSessions
from lavinpy.wire.passwords import BCRYPT_ALGORITHM, DEFAULT_ALGORITHM, verify_password
from tests.amqp.session_client import PROTOCOL_HEADER, Harness

BCRYPT_COST = 8  # fast enough for a test, slow enough to measure (a few ms)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(Config(data_dir=str(tmp_path)))
    b.open()
    yield b
    b.close()


def _bcrypt_user(broker: Broker, name: str, password: str, cost: int = BCRYPT_COST) -> str:
    users = broker.users
    assert users is not None
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(cost, b"2a")).decode()
    users.add_user_with_hash(name, hashed, BCRYPT_ALGORITHM)
    users.set_permissions(name, "/", ".*", ".*", ".*")
    return hashed


async def _login(broker: Broker, user: str, password: str, peer: str = "127.0.0.1") -> LoginOutcome:
    return await broker.logins.attempt(LoginRequest("AMQP 0-9-1", "PLAIN", user, password, peer)).run()


def test_attempts_in_flight_count_for_the_next_ones_delay() -> None:
    t = LoginThrottle()
    free = login_throttle.FREE_FAILURES
    delays = [t.begin("10.0.0.1") for _ in range(free + 2)]  # parallel: none decided yet
    assert delays[:free] == [0.0] * free
    assert delays[free:] == [login_throttle.BASE_DELAY, 2 * login_throttle.BASE_DELAY]
    for _ in range(free + 2):
        t.end("10.0.0.1", "victim", "PLAIN", False)
    assert t.delay("10.0.0.1") == login_throttle.BASE_DELAY * 2 ** 2


def test_a_good_login_of_another_user_does_not_reset_the_failures() -> None:
    t = LoginThrottle()
    for _ in range(login_throttle.FREE_FAILURES):
        t.begin("10.0.0.1")
        t.end("10.0.0.1", "victim", "PLAIN", False)
    assert t.delay("10.0.0.1") == login_throttle.BASE_DELAY
    t.begin("10.0.0.1")
    t.end("10.0.0.1", "attacker", "PLAIN", True)  # the guesser's own account resets nothing
    assert t.delay("10.0.0.1") == login_throttle.BASE_DELAY

    t = LoginThrottle()
    t.begin("h")
    t.end("h", "u", "PLAIN", False)
    t.begin("h")
    t.end("h", "u", "PLAIN", True)  # a typo, then the right password: the address is forgotten
    assert t.delay("h") == 0.0


def test_failures_in_flight_count_after_a_good_login() -> None:
    t = LoginThrottle()
    guesses = login_throttle.FREE_FAILURES
    for _ in range(guesses):
        t.begin("h")
    t.begin("h")
    t.end("h", "u", "PLAIN", True)  # a good login while the guesses are being checked
    for _ in range(guesses):
        t.end("h", "u", "PLAIN", False)
    assert t.delay("h") == login_throttle.BASE_DELAY


def test_unknown_users_take_as_long_as_known_ones(broker: Broker) -> None:
    _bcrypt_user(broker, "known", "secret", cost=10)

    async def timings() -> tuple[list[float], list[float]]:
        await _login(broker, "nobody", "x", "10.1.0.1")  # the first unknown name makes the dummy hash
        known, unknown = [], []
        for i in range(6):  # each from its own address: the throttle adds nothing
            for name, times in (("known", known), (f"nobody{i}", unknown)):
                started = time.perf_counter()
                outcome = await _login(broker, name, "wrong", f"10.0.{i}.{len(times)}{len(name)}")
                times.append(time.perf_counter() - started)
                assert outcome.refusal is Refusal.CREDENTIALS
        return known, unknown

    known, unknown = asyncio.run(timings())
    ratio = statistics.median(unknown) / statistics.median(known)
    assert 0.5 < ratio < 2.0, (known, unknown)


def test_slow_hashes_are_checked_off_the_event_loop(broker: Broker) -> None:
    hashed = _bcrypt_user(broker, "bob", "secret", cost=11)
    started = time.perf_counter()
    bcrypt.checkpw(b"wrong", hashed.encode())
    one_check = time.perf_counter() - started  # on this machine, under its load now

    async def run() -> tuple[list[float], list[LoginOutcome]]:
        lags: list[float] = []
        done = False

        async def ticker() -> None:
            while not done:
                before = time.perf_counter()
                await asyncio.sleep(0.005)
                lags.append(time.perf_counter() - before - 0.005)

        tick = asyncio.create_task(ticker())
        outcomes = await asyncio.gather(*(_login(broker, "bob", "wrong", f"10.2.0.{i}") for i in range(6)))
        done = True
        await tick
        return sorted(lags), outcomes

    lags, outcomes = asyncio.run(run())
    assert all(o.refusal is Refusal.CREDENTIALS for o in outcomes)
    # A check on the loop would hold it for a whole hash: nearly every tick would be that late.
    # Off the loop the ticks go on (the odd late one is the machine's load, not the login).
    p90 = lags[int(len(lags) * 0.9)]
    assert len(lags) > 6 * 4 and p90 < one_check / 2, (len(lags), p90, one_check)


def test_a_bcrypt_user_is_rehashed_on_its_first_good_login(broker: Broker) -> None:
    hashed = _bcrypt_user(broker, "bob", "secret")
    assert asyncio.run(_login(broker, "bob", "wrong")).refusal is Refusal.CREDENTIALS
    assert broker.users is not None and broker.users.password_of("bob") == (hashed, BCRYPT_ALGORITHM)
    assert asyncio.run(_login(broker, "bob", "secret")).ok
    [stored] = [u for u in json.loads(broker.datadir.users_file.read_text()) if u["name"] == "bob"]
    assert stored["hashing_algorithm"] == DEFAULT_ALGORITHM
    assert verify_password("secret", stored["password_hash"], DEFAULT_ALGORITHM)
    # From now on the check is cheap: decided at once, no worker pool.
    attempt = broker.logins.attempt(LoginRequest("AMQP 0-9-1", "PLAIN", "bob", "secret", "10.3.0.1"))
    outcome = attempt.decide_now()
    assert outcome is not None and outcome.ok


def test_rehashing_can_be_turned_off(tmp_path: Path) -> None:
    b = Broker(Config(data_dir=str(tmp_path), rehash_bcrypt_on_login=False))
    b.open()
    try:
        hashed = _bcrypt_user(b, "bob", "secret")
        assert asyncio.run(_login(b, "bob", "secret")).ok
        assert b.users is not None and b.users.password_of("bob") == (hashed, BCRYPT_ALGORITHM)
    finally:
        b.close()


def test_a_good_check_is_remembered_until_the_user_changes(broker: Broker) -> None:
    _bcrypt_user(broker, "bob", "secret")
    broker.config.rehash_bcrypt_on_login = False
    assert asyncio.run(_login(broker, "bob", "secret")).ok
    attempt = broker.logins.attempt(LoginRequest("HTTP", "PLAIN", "bob", "secret", "10.4.0.1"))
    outcome = attempt.decide_now()  # remembered: no second bcrypt check
    assert outcome is not None and outcome.ok
    wrong = broker.logins.attempt(LoginRequest("HTTP", "PLAIN", "bob", "other", "10.4.0.2"))
    assert wrong.decide_now() is None  # another password is checked
    wrong.abandon()
    assert broker.users is not None
    broker.users.change_password("bob", "new")  # a change forgets every remembered check
    attempt = broker.logins.attempt(LoginRequest("HTTP", "PLAIN", "bob", "secret", "10.4.0.3"))
    outcome = attempt.decide_now()
    assert outcome is not None and outcome.refusal is Refusal.CREDENTIALS


def test_amqp_pipelined_login_of_a_bcrypt_user_waits_for_the_pool(tmp_path: Path) -> None:
    harness = Harness(tmp_path)
    try:
        _bcrypt_user(harness.broker, "bob", "secret")
        client = harness.connect()
        client.send(PROTOCOL_HEADER)
        client.read()
        client.send((0, commands.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                                    response="\0bob\0secret", locale="en_US")),
                    (0, commands.Connection.TuneOk(channel_max=0, frame_max=131072, heartbeat=0)),
                    (0, commands.Connection.Open(virtual_host="/")))
        assert client.read() == []  # the hash is being checked; nothing after StartOk is handled yet
        harness.scheduling.run_tasks()
        assert client.names() == [(0, "Connection.Tune"), (0, "Connection.OpenOk")]
        client.open_channel()
    finally:
        harness.close()


def _mqtt_connect(sessions: MQTTSessions, client_id: str, username: str, password: bytes) -> MQTTConnection:
    conn = sessions.new_connection(("127.0.0.1", 50000))
    conn.start()
    conn.receive_data(codec.encode_connect(client_id, username=username, password=password, keepalive=60))
    return conn


def test_mqtt_takeover_needs_the_newcomer_authenticated_and_authorised(tmp_path: Path) -> None:
    harness = Harness(tmp_path, fsync="never")
    try:
        users = harness.broker.users
        assert users is not None
        users.add_user("other", "pw")
        users.set_permissions("other", "/", "", ".*", ".*")  # may not delete the session's queue
        sessions = MQTTSessions(harness.broker)
        first = _mqtt_connect(sessions, "device", "guest", b"guest")
        assert b"".join(first.data_to_send()) == codec.connack(False, codec.ACCEPTED)
        name = b"a/b"
        first.receive_data(bytes((0x82, 2 + 2 + len(name) + 1)) + (1).to_bytes(2, "big")
                           + len(name).to_bytes(2, "big") + name + b"\x01")  # SUBSCRIBE a/b QoS 1
        first.data_to_send()

        wrong = _mqtt_connect(sessions, "device", "guest", b"wrong")
        assert b"".join(wrong.data_to_send()) == codec.connack(False, codec.BAD_USERNAME_OR_PASSWORD)
        unauthorised = _mqtt_connect(sessions, "device", "other", b"pw")
        assert b"".join(unauthorised.data_to_send()) == codec.connack(False, codec.NOT_AUTHORIZED)
        for refused in (wrong, unauthorised):
            assert MQTTEffect.CLOSE in refused.take_effects()
        assert not first.closed and MQTTEffect.CLOSE not in first.take_effects()
        assert sessions.clients[("/", "device")] is first
        assert harness.broker.client_limits.connections_by_user["other"] == 0  # admitted, then uncounted
        first.receive_data(codec.publish("a/b", b"still here", 1, False, False, 9))
        harness.run_soon()
        assert first.data_to_send()  # its own message and the PUBACK
    finally:
        harness.close()


def test_mqtt_connect_of_a_bcrypt_user_waits_for_the_pool_with_its_packets(tmp_path: Path) -> None:
    harness = Harness(tmp_path, fsync="never")
    try:
        _bcrypt_user(harness.broker, "bob", "secret")
        sessions = MQTTSessions(harness.broker)

        async def connect() -> tuple[MQTTConnection, list]:
            conn = sessions.new_connection(("127.0.0.1", 50001))
            conn.start()
            name = b"a/b"
            subscribe = (bytes((0x82, 2 + 2 + len(name) + 1)) + (1).to_bytes(2, "big")
                         + len(name).to_bytes(2, "big") + name + b"\x00")
            conn.receive_data(codec.encode_connect("dev", username="bob", password=b"secret", keepalive=0)
                              + subscribe)  # CONNECT and SUBSCRIBE in one read
            assert conn.data_to_send() == [] and conn.reading_paused  # the hash is being checked
            for _ in range(500):
                await asyncio.sleep(0.01)
                if conn.connected:
                    break
            harness.run_soon()
            return conn, codec.PacketReader(1 << 20).feed(b"".join(conn.data_to_send()))

        conn, packets = asyncio.run(connect())
        assert [kind for kind, _, _ in packets] == [codec.CONNACK, codec.SUBACK]
        assert not conn.reading_paused and not conn.closed
    finally:
        harness.close()
