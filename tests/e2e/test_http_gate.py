"""lavinpy.http.gate: connections to an HTTP port before its stack is loaded wait, and each is then served
by the loaded protocol with every byte it sent (also before the load, and after an end of its input)."""

from __future__ import annotations

import asyncio

from lavinpy.http.gate import HttpGate


class Echo(asyncio.Protocol):
    """Answers each read with ``what:`` and the bytes read; answers an end of input with ``end`` and closes."""

    def __init__(self, what: str) -> None:
        self.what = what.encode()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(self.what + b":" + data)  # type: ignore[attr-defined]

    def eof_received(self) -> bool:
        self.transport.write(b"end")  # type: ignore[attr-defined]
        self.transport.close()
        return True


async def serve(gate: HttpGate, kind: str, what: str) -> tuple[asyncio.AbstractServer, int]:
    server = await asyncio.get_running_loop().create_server(lambda: gate.factory(kind, what)(None), "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def read_all(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.read(), 5)


async def closed_by_the_server(reader: asyncio.StreamReader) -> bool:
    """Closed with nothing sent: an end of stream, or a reset (what it read was left unread)."""
    try:
        return await read_all(reader) == b""
    except ConnectionResetError:
        return True


def test_connections_before_the_load_wait_and_are_served_with_all_they_sent() -> None:
    async def scenario() -> None:
        release = asyncio.Event()
        loads = 0

        async def load() -> dict:
            nonlocal loads
            loads += 1
            await release.wait()
            return {"management": lambda client, what: Echo(what), "metrics": lambda client, what: Echo(what)}

        gate = HttpGate(load)
        api, api_port = await serve(gate, "management", "HTTP")
        metrics, metrics_port = await serve(gate, "metrics", "Prometheus")
        clients = []
        for port, body in ((api_port, b"a" * 100_000), (metrics_port, b"m"), (api_port, b"b")):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(body)
            await writer.drain()
            clients.append((reader, writer, body))
        # one that ends its input before the load: its request is still answered
        reader, writer = await asyncio.open_connection("127.0.0.1", api_port)
        writer.write(b"last")
        writer.write_eof()
        # one that goes away while waiting: nothing is handed over for it, and the others are unaffected
        _, gone = await asyncio.open_connection("127.0.0.1", api_port)
        await asyncio.sleep(0.1)
        gone.close()
        await asyncio.sleep(0.1)
        assert not gate.loaded
        assert loads == 1  # one load, whatever the number of connections waiting for it
        release.set()
        for got_reader, got_writer, body in clients:
            got_writer.write_eof()
            got = await read_all(got_reader)
            # the bytes come in one or more reads, each answered with the port's name before it
            what = b"Prometheus:" if body == b"m" else b"HTTP:"
            assert got.endswith(b"end")
            assert got[:-3].replace(what, b"") == body
            got_writer.close()
        assert await read_all(reader) == b"HTTP:lastend"
        writer.close()
        assert gate.loaded
        # after the load a connection gets the loaded protocol at once
        reader, writer = await asyncio.open_connection("127.0.0.1", metrics_port)
        writer.write(b"x")
        writer.write_eof()
        assert await read_all(reader) == b"Prometheus:xend"
        writer.close()
        await gate.close()
        api.close()
        metrics.close()

    asyncio.run(scenario())


def test_a_failed_load_closes_the_waiting_connections_and_the_next_one_loads_again() -> None:
    async def scenario() -> None:
        attempts = 0

        async def load() -> dict:
            nonlocal attempts
            attempts += 1
            if attempts == 1:
                raise ImportError("no aiohttp")
            return {"management": lambda client, what: Echo(what)}

        gate = HttpGate(load)
        server, port = await serve(gate, "management", "HTTP")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"q")
        assert await closed_by_the_server(reader)  # closed, not left hanging
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"q")
        writer.write_eof()
        assert await read_all(reader) == b"HTTP:qend"
        writer.close()
        assert attempts == 2
        await gate.close()
        server.close()

    asyncio.run(scenario())


def test_closing_the_gate_closes_connections_still_waiting() -> None:
    async def scenario() -> None:
        never = asyncio.Event()

        async def load() -> dict:
            await never.wait()
            return {}

        gate = HttpGate(load)
        server, port = await serve(gate, "management", "HTTP")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"q")
        await asyncio.sleep(0.1)
        closing = asyncio.get_running_loop().create_task(gate.close())
        await asyncio.sleep(0.05)
        never.set()  # the load ends after the close began: nothing is handed over
        await closing
        assert await closed_by_the_server(reader)
        writer.close()
        # a connection after the close is refused by the gate too
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await closed_by_the_server(reader)
        writer.close()
        server.close()

    asyncio.run(scenario())
