"""connection.update-secret on a password's login: RabbitMQ asks only the auth backends whose
credentials expire (a token's) to decide a new secret, and answers update-secret-ok to the others
without checking it. So does lavinpy: the secret is taken as it is, no login is attempted (nothing is
counted by the throttle), and the user's permissions still decide each later operation. (A token's
new secret is decided as a login: tests/e2e/test_oauth2.py, with a real OpenID provider.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pamqp import commands
from session_client import Client, Harness


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path)
    users = h.broker.users
    assert users is not None
    users.add_user("rotating", "first-secret")
    users.set_permissions("rotating", "/", ".*", ".*", ".*")
    yield h
    h.close()


def _client(harness: Harness) -> Client:
    client = harness.connect()
    client.handshake("rotating", "first-secret")
    return client


def _update(secret: str) -> tuple[int, commands.Connection.UpdateSecret]:
    return 0, commands.Connection.UpdateSecret(new_secret=secret, reason="rotation")


def test_a_new_secret_is_answered_at_once_and_the_connection_goes_on(harness: Harness) -> None:
    client = _client(harness)
    assert harness.broker.users is not None
    harness.broker.users.change_password("rotating", "second-secret")
    client.send(_update("second-secret"), (1, commands.Channel.Open()))
    assert client.names() == [(0, "Connection.UpdateSecretOk"), (1, "Channel.OpenOk")]
    client.send((1, commands.Queue.Declare(queue="after-update")))
    assert client.names() == [(1, "Queue.DeclareOk")]


def test_the_secret_is_not_checked_as_a_password(harness: Harness) -> None:
    client = _client(harness)
    counts = dict(harness.broker.logins.counts)
    client.send(_update("not-the-password"), (1, commands.Channel.Open()))
    assert client.names() == [(0, "Connection.UpdateSecretOk"), (1, "Channel.OpenOk")]
    assert harness.broker.logins.counts == counts  # no login attempted, none refused
    assert not harness.broker.logins.decides_new_secret(client.conn.login_outcome)


def test_permissions_still_decide_each_operation_after_it(harness: Harness) -> None:
    client = _client(harness)
    client.send((1, commands.Channel.Open()))
    assert client.names() == [(1, "Channel.OpenOk")]
    assert harness.broker.users is not None
    harness.broker.users.set_permissions("rotating", "/", "^own-", ".*", ".*")
    client.send(_update("first-secret"), (1, commands.Queue.Declare(queue="shared")))
    [(_, ok), (channel, close)] = client.methods()
    assert isinstance(ok, commands.Connection.UpdateSecretOk)
    assert channel == 1 and isinstance(close, commands.Channel.Close)
    assert close.reply_code == 403 and "configure access to queue 'shared'" in close.reply_text
