"""Failed logins from one address are answered more slowly, logged once per interval, and stall no one."""

from __future__ import annotations

import time

import pika

from lavinpy.broker.access import login_throttle

from .conftest import lavinpy_only
from .rawamqp import CLIENT_PROPERTIES, PROTOCOL_HEADER, RawAMQP, commands

pytestmark = lavinpy_only("reads the broker's log")


def _login(broker, username: str, password: str) -> tuple[float, object]:
    """Seconds from start-ok to the broker's answer, and that answer (tune or connection.close)."""
    with RawAMQP(broker.host, broker.port) as c:
        c.send_raw(PROTOCOL_HEADER)
        c.expect(commands.Connection.Start, 0)
        started = time.monotonic()
        c.send(0, commands.Connection.StartOk(client_properties=CLIENT_PROPERTIES,
                                              response=f"\0{username}\0{password}"))
        _, answer = c.recv()
        return time.monotonic() - started, answer


def test_repeated_failures_are_answered_later(fresh_broker):
    witness = pika.BlockingConnection(pika.URLParameters(fresh_broker.url))
    wch = witness.channel()
    failures = login_throttle.FREE_FAILURES + 4
    took = []
    for _ in range(failures):
        elapsed, answer = _login(fresh_broker, "guest", "wrong")
        assert isinstance(answer, commands.Connection.Close)
        assert answer.reply_code == 403
        assert answer.reply_text == ("ACCESS_REFUSED - Login was refused using authentication mechanism "
                                     "PLAIN. For details see the broker logfile.")
        took.append(elapsed)
        wch.queue_declare("", exclusive=True)  # an open connection is served as usual meanwhile
    assert max(took[:login_throttle.FREE_FAILURES]) < login_throttle.BASE_DELAY
    for extra, elapsed in enumerate(took[login_throttle.FREE_FAILURES:]):
        assert elapsed >= 0.9 * login_throttle.BASE_DELAY * 2 ** extra, took

    # a right password from the same address waits too (no early answer to time out on) ...
    elapsed, answer = _login(fresh_broker, "guest", "guest")
    assert isinstance(answer, commands.Connection.Tune)
    assert elapsed >= 0.9 * login_throttle.BASE_DELAY * 2 ** 4
    # ... and resets the address
    elapsed, answer = _login(fresh_broker, "guest", "wrong")
    assert isinstance(answer, commands.Connection.Close) and elapsed < login_throttle.BASE_DELAY

    # a slow answer does not stall other clients: the witness is served while a login waits
    with RawAMQP(fresh_broker.host, fresh_broker.port) as c:
        for _ in range(login_throttle.FREE_FAILURES + 2):
            _login(fresh_broker, "guest", "wrong")
        c.send_raw(PROTOCOL_HEADER)
        c.expect(commands.Connection.Start, 0)
        c.send(0, commands.Connection.StartOk(client_properties=CLIENT_PROPERTIES, response="\0guest\0bad"))
        started = time.monotonic()
        wch.queue_declare("", exclusive=True)
        assert time.monotonic() - started < login_throttle.BASE_DELAY * 2  # the login waits 0.4 s
        _, answer = c.recv()
        assert isinstance(answer, commands.Connection.Close) and answer.reply_code == 403
        assert time.monotonic() - started >= 0.9 * login_throttle.BASE_DELAY * 2 ** 2
    witness.close()


def test_failed_logins_are_summarised_not_logged_one_by_one(fresh_broker):
    failures = 6
    for _ in range(failures):
        _login(fresh_broker, "nobody", "wrong")
    log = fresh_broker.log
    assert log.count("login refused for user 'nobody'") == 1, log[-3000:]
    deadline = time.monotonic() + login_throttle.LOG_INTERVAL + 5
    summary = f"{failures - 1} more failed logins in the last"
    while summary not in fresh_broker.log:
        assert time.monotonic() < deadline, fresh_broker.log[-3000:]
        time.sleep(0.2)
    log = fresh_broker.log
    assert "127.0.0.1 (5)" in log and "'nobody' (5)" in log
    assert log.count("login refused") == 1
