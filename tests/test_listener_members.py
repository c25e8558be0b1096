"""The leader's check of a PROXY line from an address not among the cluster members it last read
(lavinpy.listeners): it asks for the members again before refusing, refuses with a text naming the
membership check, and never mistakes a client of its own (an HTTP "POST" sent a byte at a time) for a
PROXY line. In-process, over real loopback sockets; the cluster test with etcd is
tests/cluster/test_rejoin_trust.py."""

from __future__ import annotations

import asyncio
import socket

from lavinpy.listeners import NOT_A_MEMBER, ProxyPolicy, listen_forwarded
from lavinpy.wire.proxy_header import ProxyHeader, TrustedSources

AMQP_HEADER = b"AMQP\x00\x00\x09\x01"
PROXY_LINE = b"PROXY TCP4 203.0.113.9 127.0.0.1 5000 5672\r\n"


class Recorder(asyncio.Protocol):
    def __init__(self, forwarded: ProxyHeader | None, served: list[Recorder]) -> None:
        self.forwarded = forwarded
        self.data = b""
        served.append(self)

    def data_received(self, data: bytes) -> None:
        self.data += data


async def _exchange(member_now, parts: list[bytes], what: str = "AMQP") -> tuple[bytes, list[Recorder], list[str]]:
    """Send ``parts`` (a pause between them) to a listener whose last read of the members lists nobody;
    what the client read until the close (or a pause), the connections served, the refusals logged."""
    served: list[Recorder] = []
    refusals: list[str] = []
    policy = ProxyPolicy(TrustedSources([]), lambda host: False,
                         lambda what, peer, reason: refusals.append(reason), member_now)
    [listener] = await listen_forwarded(lambda header: Recorder(header, served), ["127.0.0.1"], 0, what, policy)
    port = listener.sockets[0].getsockname()[1]
    loop = asyncio.get_running_loop()
    try:
        client = socket.create_connection(("127.0.0.1", port))
        client.setblocking(False)
        for index, part in enumerate(parts):
            if index:
                await asyncio.sleep(0.05)
            await loop.sock_sendall(client, part)
        reply = b""
        try:
            while chunk := await asyncio.wait_for(loop.sock_recv(client, 1024), 0.5):
                reply += chunk
        except TimeoutError:
            pass
        client.close()
        await asyncio.sleep(0.05)
    finally:
        listener.close()
    return reply, served, refusals


def test_a_member_that_registered_after_the_last_read_is_trusted() -> None:
    asked: list[tuple[str, float]] = []

    async def member_now(host: str, since: float) -> bool:
        asked.append((host, since))
        return True

    reply, served, refusals = asyncio.run(_exchange(member_now, [PROXY_LINE + AMQP_HEADER]))
    assert reply == b"" and refusals == []
    assert asked and asked[0][0] == "127.0.0.1"
    [connection] = served
    assert connection.forwarded is not None and connection.forwarded.source == ("203.0.113.9", 5000)
    assert connection.data == AMQP_HEADER  # the line was taken off, the client's bytes go on


def test_a_proxy_line_from_no_member_is_refused_naming_the_membership_check() -> None:
    async def member_now(host: str, since: float) -> bool:
        return False

    reply, served, refusals = asyncio.run(_exchange(member_now, [PROXY_LINE + AMQP_HEADER]))
    assert reply == AMQP_HEADER  # as the AMQP port answers any bad protocol header
    assert served == [] and refusals == [NOT_A_MEMBER]
    assert "cluster member" in NOT_A_MEMBER and "proxy_protocol_trusted_sources" in NOT_A_MEMBER


def test_members_that_cannot_be_read_refuse_the_line_and_close() -> None:
    async def member_now(host: str, since: float) -> bool:
        raise ConnectionError("etcd client closed")

    reply, served, refusals = asyncio.run(_exchange(member_now, [PROXY_LINE]))
    assert reply == AMQP_HEADER and served == [] and refusals == [NOT_A_MEMBER]


def test_a_client_of_its_own_is_served_without_asking_even_a_byte_at_a_time() -> None:
    async def member_now(host: str, since: float) -> bool:
        raise AssertionError("asked about a client that sent no PROXY line")

    request = b"POST /api/exchanges HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
    reply, served, refusals = asyncio.run(_exchange(member_now, [request[:1], request[1:3], request[3:]], "HTTP"))
    assert refusals == []
    [connection] = served
    assert connection.forwarded is None and connection.data == request
