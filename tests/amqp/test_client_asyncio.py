"""The asyncio adapter (lavinpy.wire.client_asyncio) over a socket pair whose other end feeds the
broker's sans-IO AMQP connection in process."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from pamqp import commands
from session_client import Harness

from lavinpy.amqp.connection import AMQPConnection
from lavinpy.wire.client_asyncio import ClientError, ClientProtocol
from lavinpy.wire.client_connection import ClientConnection
from lavinpy.wire.client_events import Confirmed, Delivery


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path, heartbeat=20)
    yield h
    h.close()


class BrokerSide(asyncio.Protocol):
    """The socket's broker end: bytes into the sans-IO server connection, its output back; ``mute``
    stops answering (a broker gone silent)."""

    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.server = AMQPConnection(harness.sessions, ("127.0.0.1", 50000))
        self.server.start()
        self.mute = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.mute:
            return
        self.server.receive_data(data)
        self.harness.run_soon()
        out = b"".join(self.server.data_to_send())
        if out and self.transport is not None:
            self.transport.write(out)


class Recording(ClientProtocol):
    def __init__(self, connection: ClientConnection) -> None:
        super().__init__(connection)
        self.deliveries: list[Delivery] = []
        self.confirms: list[Confirmed] = []

    def handle_delivery(self, delivery: Delivery) -> None:
        self.deliveries.append(delivery)

    def handle_confirm(self, confirm: Confirmed) -> None:
        self.confirms.append(confirm)


async def connected(harness: Harness, **options: object) -> tuple[Recording, BrokerSide]:
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    _, broker = await loop.connect_accepted_socket(lambda: BrokerSide(harness), theirs)
    _, client = await loop.create_connection(lambda: Recording(ClientConnection(**options)), sock=ours)  # type: ignore[arg-type]
    await asyncio.wait_for(client.opened, 5)
    return client, broker


def test_calls_publish_confirm_consume_and_close(harness: Harness) -> None:
    async def scenario() -> None:
        client, _ = await connected(harness)
        ch = await client.open_channel()
        ok = await client.call(ch, commands.Queue.Declare(queue="q"), commands.Queue.DeclareOk)
        assert ok.method.queue == "q"
        await client.confirm_select(ch)
        await client.call(ch, commands.Basic.Consume(queue="q"), commands.Basic.ConsumeOk)
        assert client.basic_publish(ch, "", "q", b"\x00\x00", b"hello") == 1
        for _ in range(50):
            if client.deliveries and client.confirms:
                break
            await asyncio.sleep(0.01)
        assert [d.body for d in client.deliveries] == [b"hello"]
        assert client.confirms[-1].delivery_tag == 1 and not client.confirms[-1].nack
        await client.close()
        assert client.closed.done() and client.conn.is_closed
    asyncio.run(scenario())


def test_a_refusal_raises_and_the_channel_can_be_reopened(harness: Harness) -> None:
    async def scenario() -> None:
        client, _ = await connected(harness)
        ch = await client.open_channel()
        with pytest.raises(ClientError, match="404") as refused:
            await client.call(ch, commands.Queue.Declare(queue="absent", passive=True), commands.Queue.DeclareOk)
        assert refused.value.reply_code == 404
        assert await client.open_channel(ch) == ch
        # The code, not the text, says which refusal it is: this 406 names a queue with "404" in it.
        await client.call(ch, commands.Queue.Declare(queue="q404"), commands.Queue.DeclareOk)
        with pytest.raises(ClientError, match="404") as refused:
            await client.call(ch, commands.Queue.Declare(queue="q404", durable=True), commands.Queue.DeclareOk)
        assert refused.value.reply_code == 406
        await client.close()
    asyncio.run(scenario())


def test_a_silent_broker_is_dead_after_two_heartbeats(harness: Harness) -> None:
    async def scenario() -> None:
        client, broker = await connected(harness, heartbeat=1)
        ch = await client.open_channel()
        broker.mute = True
        started = asyncio.get_running_loop().time()
        with pytest.raises(ClientError, match="missed heartbeats"):
            await client.call(ch, commands.Queue.Declare(queue="q"), commands.Queue.DeclareOk, timeout=10)
        assert 1.5 <= asyncio.get_running_loop().time() - started < 4
        await asyncio.wait_for(client.closed, 1)
    asyncio.run(scenario())
