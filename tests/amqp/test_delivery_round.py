"""A round of deliveries booked and framed in one call (``amqp.delivery_round``) gives every channel the
frames, tags, redelivered flags and books, and the queue and node the counters, that the same picks give
through ``Channel.deliver_run`` per consumer, and that one delivery at a time gives: consumers with
windows of 1 to 100 on channels of their own, several channels of one connection, two consumers sharing
a channel, a no-ack consumer, redeliveries and published runs of 1 to 300 messages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pamqp import body, commands, frame, header
from session_client import Client, Harness

from lavinpy.amqp import channel as channel_module
from lavinpy.broker.queues import consumer_set

# (connection, channel, consumer tag, prefetch (None: no-ack)); twins share a channel
CONSUMERS = [(0, 1, "one", 1), (1, 1, "three", 3), (2, 1, "five", 5), (2, 2, "four", 4), (3, 1, "noack", None),
             (4, 1, "wide", 100)]
TWINS = [(5, 1, "twin-a", 7), (5, 1, "twin-b", 2)]
# whole rounds where two consumers of one channel each take several messages of a run
EVEN_TWINS = [(0, 1, "twin-a", 50), (0, 1, "twin-b", 50), (1, 1, "solo", 50), (2, 1, "noack", None)]
REQUEUING = {"three", "solo"}  # these nack (requeue) everything they hold after each run: redeliveries


def _publishes(client: Client, count: int, start: int) -> bytes:
    return b"".join(frame.marshal(f[1], f[0]) for i in range(count)
                    for f in client.publish(1, "work", b"m%d" % (start + i)))


def _deliveries(client: Client) -> dict[int, list[tuple[Any, ...]]]:
    """The client's deliveries per channel: (consumer tag, delivery tag, redelivered, routing key, body)."""
    per_channel: dict[int, list[tuple[Any, ...]]] = {}
    deliver = None
    for channel, value in client.read():
        if isinstance(value, commands.Basic.Deliver):
            deliver = value
        elif isinstance(value, body.ContentBody):
            assert deliver is not None
            per_channel.setdefault(channel, []).append(
                (deliver.consumer_tag, deliver.delivery_tag, deliver.redelivered, deliver.routing_key, value.value))
        else:
            assert isinstance(value, header.ContentHeader | commands.Basic.CancelOk), value
    return per_channel


def scenario(tmp_path: Path, mode: str, consumers: list[tuple[int, int, str, int | None]],
             rounds: int = 5) -> dict[str, Any]:
    """``consumers`` on the queue, published runs, acks, a nack with requeue and a backlog; returns what
    each channel received, the books and the counters."""
    harness = Harness(tmp_path)
    try:
        vhost = harness.broker.vhosts["/"]
        if mode == "one":  # the one-at-a-time paths (as while a channel-wide prefetch exists)
            vhost.channel_wide_prefetches += 1
        publisher = harness.connect()
        publisher.handshake()
        publisher.open_channel(1)
        publisher.send((1, commands.Queue.Declare(queue="work")))
        publisher.read()
        clients: list[Client] = []
        for conn, channel, tag, prefetch in consumers:
            while len(clients) <= conn:
                clients.append(harness.connect())
                clients[-1].handshake()
            client = clients[conn]
            if channel not in client.conn.channels:
                client.open_channel(channel)
            if prefetch is not None:
                client.send((channel, commands.Basic.Qos(prefetch_count=prefetch)))
            client.send((channel, commands.Basic.Consume(queue="work", consumer_tag=tag, no_ack=prefetch is None)))
            client.read()
        received: list[dict[int, list[tuple[Any, ...]]]] = [{} for _ in clients]

        def collect() -> None:
            harness.run_soon()
            for i, client in enumerate(clients):
                for channel, got in _deliveries(client).items():
                    received[i].setdefault(channel, []).extend(got)

        queue = vhost.queues["work"]
        serial = backlog = 0
        for count in (1, 6, 40, 300, 3)[:rounds]:
            if count == 40:  # the no-ack consumer would take everything: the windows fill from now on
                for i, client in enumerate(clients):
                    if any(c.tag == "noack" for c in client.conn.channels[1].consumers.values()):
                        clients[i].send((1, commands.Basic.Cancel(consumer_tag="noack")))
            publisher.send(_publishes(publisher, count, serial))
            serial += count
            collect()
            backlog = max(backlog, queue.message_count)
            # every consumer acks its oldest delivery, but the requeuing ones nack everything they have
            for client in clients:
                for channel_id, channel in client.conn.channels.items():
                    tags = list(channel.deliveries.unacked)
                    if not tags:
                        continue
                    if any(c.tag in REQUEUING for c in channel.consumers.values()):
                        client.send((channel_id, commands.Basic.Nack(delivery_tag=0, multiple=True, requeue=True)))
                    else:
                        client.send((channel_id, commands.Basic.Ack(delivery_tag=tags[0])))
            collect()
        books = {(i, channel_id): [(tag, item.pos, item.consumer.tag)
                                   for tag, item in channel.deliveries.unacked.items()]
                 for i, client in enumerate(clients) for channel_id, channel in client.conn.channels.items()}
        stats = queue.stats
        return {"received": received, "books": books, "ready": queue.message_count, "backlog": backlog,
                "queue": (stats.deliver, stats.deliver_no_ack, stats.redeliver, stats.ack),
                "unacked": {c.tag: c.unacked for c in queue.consumers}}
    finally:
        harness.close()


@pytest.mark.parametrize("consumers", [CONSUMERS, CONSUMERS + TWINS, EVEN_TWINS], ids=["own", "twins", "even"])
def test_a_round_in_one_call_gives_what_runs_and_one_at_a_time_give(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   consumers: list[Any]) -> None:
    calls = {"round": 0}
    deliver_round = channel_module.Channel.deliver_round

    def counted(*args: Any) -> Any:
        calls["round"] += 1
        return deliver_round(*args)

    monkeypatch.setattr(channel_module.Channel, "deliver_round", staticmethod(counted))
    result = scenario(tmp_path / "round", "round", consumers)
    assert calls["round"] > 0  # the scenario took the path it is about
    monkeypatch.setattr(channel_module.Channel, "deliver_round", None)  # each consumer's run through deliver_run
    runs = scenario(tmp_path / "runs", "runs", consumers)
    one = scenario(tmp_path / "one", "one", consumers)
    assert result == runs
    if consumers is CONSUMERS:
        assert runs == one
    else:
        # Consumers sharing a channel get their shares of a round one after the other there, not in
        # turns as one at a time (their delivery tags differ): each channel's oldest delivery, acked
        # after each publish, is then another consumer's, and the windows differ from there. Until
        # then each consumer got the same messages in the same order.
        def per_consumer(mode: str) -> list[dict[str, list[tuple[Any, ...]]]]:
            got = scenario(tmp_path / f"two-{mode}", mode, consumers, rounds=2)["received"]
            return [{tag: [entry[2:] for entry in each if entry[0] == tag] for each in per_client.values()
                     for tag in {entry[0] for entry in each}} for per_client in got]
        assert per_consumer("runs") == per_consumer("one")


def test_round_robin_over_many_consumers_is_one_call_per_round(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A published run over consumers on channels of their own: whole rounds and a part of one, each
    consumer's share one run with consecutive tags, one ``deliver_round`` call."""
    seen: list[int] = []
    monkeypatch.setattr(consumer_set, "deliver_round_runs",
                        lambda *args: pytest.fail("the AMQP channel's round function is used"))
    deliver_round = channel_module.Channel.deliver_round

    def counted(consumers: list[Any], *args: Any) -> Any:
        seen.append(len(consumers))
        return deliver_round(consumers, *args)

    monkeypatch.setattr(channel_module.Channel, "deliver_round", staticmethod(counted))
    harness = Harness(tmp_path)
    try:
        publisher = harness.connect()
        publisher.handshake()
        publisher.open_channel(1)
        publisher.send((1, commands.Queue.Declare(queue="work")))
        publisher.read()
        clients = []
        for i in range(10):
            client = harness.connect()
            client.handshake()
            client.open_channel(1)
            client.send((1, commands.Basic.Qos(prefetch_count=100)),
                        (1, commands.Basic.Consume(queue="work", consumer_tag=f"c{i}")))
            client.read()
            clients.append(client)
        publisher.send(_publishes(publisher, 34, 0))
        harness.run_soon()
        assert seen == [10]
        for i, client in enumerate(clients):
            got = _deliveries(client)[1]
            bodies = [b"m%d" % n for n in range(i, 34, 10)]
            assert got == [(f"c{i}", tag, False, "work", b) for tag, b in enumerate(bodies, 1)]
            assert list(client.conn.channels[1].deliveries.unacked) == list(range(1, len(bodies) + 1))
        stats = harness.broker.vhosts["/"].queues["work"].stats
        assert (stats.deliver, stats.redeliver) == (34, 0)
    finally:
        harness.close()
