"""connection.update-secret: the new secret is a login of the connection's user through the model's one
login operation. Accepted, the connection gets update-secret-ok and goes on; refused, or the user no
longer reaching the vhost, it is closed with 530 as RabbitMQ closes it. What the client sent after the
update-secret waits for the answer."""

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


def test_a_new_password_is_accepted_and_the_connection_goes_on(harness: Harness) -> None:
    client = _client(harness)
    assert harness.broker.users is not None
    harness.broker.users.change_password("rotating", "second-secret")
    client.send(_update("second-secret"), (1, commands.Channel.Open()))
    assert client.names() == [(0, "Connection.UpdateSecretOk"), (1, "Channel.OpenOk")]
    client.send((1, commands.Queue.Declare(queue="after-update")))
    assert client.names() == [(1, "Queue.DeclareOk")]


def test_the_same_password_again_is_accepted(harness: Harness) -> None:
    client = _client(harness)
    client.send(_update("first-secret"))
    assert client.names() == [(0, "Connection.UpdateSecretOk")]


def test_a_wrong_secret_closes_the_connection_with_530_and_nothing_after_it_runs(harness: Harness) -> None:
    client = _client(harness)
    client.send(_update("not-the-password"), (1, commands.Channel.Open()))
    [(channel, close)] = client.methods()
    assert channel == 0 and isinstance(close, commands.Connection.Close)
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        530, "NOT_ALLOWED - New secret was refused by one of the backends", 10, 70)
    assert 1 not in client.conn.channels


def test_the_old_password_after_a_change_is_refused(harness: Harness) -> None:
    client = _client(harness)
    assert harness.broker.users is not None
    harness.broker.users.change_password("rotating", "second-secret")
    client.send(_update("first-secret"))
    [(_, close)] = client.methods()
    assert close.reply_code == 530


def test_a_user_without_access_to_the_vhost_any_more_is_closed(harness: Harness) -> None:
    client = _client(harness)
    assert harness.broker.users is not None
    harness.broker.users.clear_permissions("rotating", "/")
    client.send(_update("first-secret"))
    [(_, close)] = client.methods()
    assert (close.reply_code, close.reply_text) == (
        530, "NOT_ALLOWED - access to vhost '/' refused for user 'rotating'")
