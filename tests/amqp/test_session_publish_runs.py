"""Runs of alike publishes (one ContentRun event from the reader) through AMQPConnection without
sockets: what the run path does not take goes one message at a time with the same outcome."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pamqp import commands
from session_client import Client, Harness


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path, max_message_size=64 * 1024)
    yield h
    h.close()


def client_with_queue(harness: Harness, *channels: int) -> Client:
    client = harness.open_client(declare=commands.Queue.Declare(queue="q"))
    for channel in channels:
        client.open_channel(channel)
    return client


def count(harness: Harness) -> int:
    return harness.broker.vhosts["/"].queues["q"].message_count


def test_a_run_to_a_missing_exchange_closes_its_channel_only(harness: Harness) -> None:
    client = client_with_queue(harness, 2)
    client.send(*[f for body in (b"a", b"b", b"c") for f in client.publish(1, "q", body, exchange="missing")],
                *[f for body in (b"d", b"e", b"f") for f in client.publish(2, "q", body)])
    [(channel, close)] = client.methods()
    assert (channel, close.name, close.reply_code) == (1, "Channel.Close", 404)
    assert "missing" in close.reply_text
    assert count(harness) == 3  # channel 2's run, in the same read


def test_a_run_inside_a_transaction_is_stored_at_its_commit(harness: Harness) -> None:
    client = client_with_queue(harness)
    client.send((1, commands.Tx.Select()))
    assert client.names() == [(1, "Tx.SelectOk")]
    client.send(*[f for body in (b"a", b"b", b"c") for f in client.publish(1, "q", body)])
    assert client.methods() == [] and count(harness) == 0
    client.send((1, commands.Tx.Commit()))
    assert client.names() == [(1, "Tx.CommitOk")]
    assert count(harness) == 3


def test_a_body_over_the_size_limit_in_a_run_is_refused_after_the_ones_before_it(harness: Harness) -> None:
    # The bodies fit a frame (128 KiB) and so a run; the limit (64 KiB) refuses the third with 406,
    # the two before it are stored, the one after it goes with the channel.
    client = client_with_queue(harness, 2)
    client.send(*[f for body in (b"a", b"b", b"c" * 70_000, b"d") for f in client.publish(1, "q", body)],
                *client.publish(2, "q", b"e"))
    [(channel, close)] = client.methods()
    assert (channel, close.name, close.reply_code) == (1, "Channel.Close", 406)
    assert "70000" in close.reply_text
    assert count(harness) == 3  # a, b and channel 2's e
