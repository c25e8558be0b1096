"""Consumers opened together (their basic.consume frames in one read) on a queue with a backlog, with
x-priority 0 and -1: once the first one's window is full, the second gets messages at once, as RabbitMQ
and LavinMQ deliver; neither waits for an ack (a reader that holds all it gets never sends one)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pamqp import body, commands
from session_client import Harness
from test_delivery_round import _publishes


@pytest.mark.parametrize("arguments", [{}, {"x-max-priority": 5}, {"x-queue-type": "quorum"}],
                         ids=["classic", "priority", "quorum"])
def test_a_lower_priority_takes_the_backlog_the_first_has_no_room_for(tmp_path: Path, arguments: dict) -> None:
    harness = Harness(tmp_path, fsync="never")
    try:
        publisher, consumer = harness.open_client(), harness.open_client()
        publisher.send((1, commands.Queue.Declare(queue="work", durable=True, arguments=arguments)))
        publisher.read()
        publisher.send(_publishes(publisher, 10, 0))
        publisher.read()
        consumer.send((1, commands.Basic.Qos(prefetch_count=3)),
                      (1, commands.Basic.Consume(queue="work", consumer_tag="first")),
                      (1, commands.Basic.Consume(queue="work", consumer_tag="second", arguments={"x-priority": -1})),
                      (1, commands.Basic.Consume(queue="work", consumer_tag="third", arguments={"x-priority": -2})))
        frames = consumer.read()
        delivers = [value for _, value in frames if isinstance(value, commands.Basic.Deliver)]
        bodies = [bytes(value.value) for _, value in frames if isinstance(value, body.ContentBody)]
        assert [d.consumer_tag for d in delivers] == ["first"] * 3 + ["second"] * 3 + ["third"] * 3
        assert bodies == [f"m{i}".encode() for i in range(9)]
        consumer.send((1, commands.Basic.Ack(delivery_tag=2, multiple=True)))  # the first's room: it goes first
        frames = consumer.read()
        assert [v.consumer_tag for _, v in frames if isinstance(v, commands.Basic.Deliver)] == ["first"]
    finally:
        harness.close()
