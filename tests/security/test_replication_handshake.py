"""What a stranger who reaches a leader's replication port can make it hold, and who may replicate over
TLS: a leader (ReplicationServer with a broker, in this process) and raw sockets or followers.

Before proving the shared secret a peer's frames are capped at a few KiB (a 64 MiB length is refused as
its header arrives), the handshake has a deadline, and the unauthenticated connections from one address
are capped in number and rate. With TLS on, a follower needs a certificate the CA signed, and checks the
leader's."""

from __future__ import annotations

import asyncio
import ssl
import struct
from pathlib import Path

import pytest

from lavinpy import config as config_module
from lavinpy.broker.broker import Broker
from lavinpy.cluster import admission
from lavinpy.cluster import replication_protocol as proto
from lavinpy.cluster.replication_client import ReplicationClient
from lavinpy.cluster.replication_server import ReplicationServer
from lavinpy.cluster.tls import replication_client_context, replication_server_context
from tests.cluster.certs import node_certificate
from tests.cluster.replication_harness import SECRET, MemoryIsr
from tests.e2e.tls_certs import CA

pytestmark = pytest.mark.timeout(60)

MiB = 1024 * 1024


async def _leader(tmp_path: Path, tls: ssl.SSLContext | None = None) -> tuple[ReplicationServer, Broker, MemoryIsr]:
    broker = Broker(config_module.load(None, env={}, overrides={"data_dir": str(tmp_path / "leader")}))
    isr = MemoryIsr()
    server = ReplicationServer(tmp_path / "leader", SECRET, "leader", isr, "127.0.0.1", 0, tls=tls)
    await server.start()
    server.attach(broker)
    broker.open()
    broker.vhosts["/"].declare_queue("q", owner=None, durable=True)
    return server, broker, isr


async def _stop(server: ReplicationServer, broker: Broker) -> None:
    await server.stop()
    broker.close()


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    """Whether the leader ends the connection within ``seconds`` (having sent nothing)."""
    try:
        async with asyncio.timeout(seconds):
            return await reader.read() == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


async def _follow(client: ReplicationClient, isr: MemoryIsr, member: str, seconds: float = 15) -> bool:
    """Run ``client`` until ``isr`` names ``member`` (True) or ``seconds`` pass or the client ends (False)."""
    task = asyncio.ensure_future(client.run())
    try:
        async with asyncio.timeout(seconds):
            while member not in isr.members and not task.done():
                await asyncio.sleep(0.05)
    except TimeoutError:
        pass
    joined = member in isr.members
    await client.close()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return joined


@pytest.mark.parametrize("sent", ["a 64 MiB frame header", "a hello over 4 KiB"])
def test_an_oversized_frame_before_authentication_closes_the_connection_at_once(tmp_path: Path, sent: str) -> None:
    async def run() -> tuple[bool, float, int]:
        server, broker, _ = await _leader(tmp_path)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            if sent == "a 64 MiB frame header":
                data = struct.pack(">IB", 64 * MiB, proto.HELLO) + bytes(64 * 1024)
            else:
                data = proto.hello("n" * 5000, proto.new_nonce())
            loop = asyncio.get_running_loop()
            started = loop.time()
            writer.write(data)
            closed = await _closed_within(reader, 1.0)
            elapsed = loop.time() - started
            # What follows is not read: the socket is gone, so the 64 MiB never find a buffer.
            pushed = 0
            try:
                for _ in range(64):
                    writer.write(bytes(MiB))
                    await asyncio.wait_for(writer.drain(), 1.0)
                    pushed += MiB
            except (ConnectionError, TimeoutError):
                pass
            writer.close()
            await asyncio.sleep(0.05)
            assert server.admission.pending == 0  # the connection gave its place back
            return closed, elapsed, pushed
        finally:
            await _stop(server, broker)
    closed, elapsed, pushed = asyncio.run(run())
    assert closed and elapsed < 1.0, f"closed: {closed} after {elapsed:.2f} s"
    assert pushed < 8 * MiB, f"{pushed} bytes written after the refusal"


def test_a_silent_peer_is_closed_at_the_handshake_deadline(tmp_path: Path) -> None:
    async def run() -> tuple[bool, bool]:
        server, broker, _ = await _leader(tmp_path)
        server.handshake_timeout = 0.5
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"\x00\x00")  # half a header, then nothing
            early = await _closed_within(reader, 0.3)
            late = await _closed_within(reader, 1.5)
            writer.close()
            return early, late
        finally:
            await _stop(server, broker)
    early, late = asyncio.run(run())
    assert not early and late


def test_unauthenticated_connections_from_one_address_are_capped(tmp_path: Path) -> None:
    async def run() -> tuple[bool, list[bool], bool]:
        server, broker, isr = await _leader(tmp_path)
        try:
            held = [await asyncio.open_connection("127.0.0.1", server.port)
                    for _ in range(admission.MAX_PENDING_PER_ADDRESS)]
            await asyncio.sleep(0.1)
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(proto.hello("one-too-many", proto.new_nonce()))
            refused = await _closed_within(reader, 0.5)
            writer.close()
            still_open = [not await _closed_within(r, 0.05) for r, _ in held]
            for _, w in held:
                w.close()
            await asyncio.sleep(0.2)
            # Their places are free again: a follower with the secret gets in.
            joined = await _follow(ReplicationClient(tmp_path / "f1", SECRET, "f1", "127.0.0.1", server.port),
                                   isr, "f1")
            return refused, still_open, joined
        finally:
            await _stop(server, broker)
    refused, still_open, joined = asyncio.run(run())
    assert refused
    assert all(still_open)
    assert joined


def test_a_burst_of_connection_attempts_from_one_address_is_cut_short(tmp_path: Path) -> None:
    async def run() -> tuple[bool, bool]:
        server, broker, _ = await _leader(tmp_path)
        server.admission.rate = 1.0  # slower than the default: the burst below is over before a refill
        try:
            for _ in range(admission.ATTEMPT_BURST):
                _, writer = await asyncio.open_connection("127.0.0.1", server.port)
                writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(proto.hello("f1", proto.new_nonce()))
            refused = await _closed_within(reader, 0.5)
            writer.close()
            await asyncio.sleep(1.2)  # the allowance refills
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(proto.hello("f1", proto.new_nonce()))
            kind, _ = await asyncio.wait_for(proto.next_frame(reader, proto.FrameDecoder()), 2.0)
            writer.close()
            return refused, kind == proto.CHALLENGE
        finally:
            await _stop(server, broker)
    refused, challenged = asyncio.run(run())
    assert refused and challenged


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    ca = CA(tmp_path_factory.mktemp("ca"), "cluster CA")
    other = CA(tmp_path_factory.mktemp("other"), "other CA")
    return {"ca": (ca.cert_path, ca.cert_path), "leader": node_certificate(ca, "leader"),
            "follower": node_certificate(ca, "follower"), "other-ca": (other.cert_path, other.cert_path),
            "stranger": node_certificate(other, "stranger")}


def test_replication_over_tls_needs_certificates_both_ways(tmp_path: Path, pki: dict) -> None:
    ca = str(pki["ca"][0])
    leader_cert, leader_key = map(str, pki["leader"])
    follower_cert, follower_key = map(str, pki["follower"])

    async def run() -> dict[str, bool]:
        server, broker, isr = await _leader(tmp_path, replication_server_context(leader_cert, leader_key, ca))
        port = server.port
        try:
            results = {}
            stranger = replication_client_context(*map(str, pki["stranger"]), ca)
            no_cert = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            no_cert.load_verify_locations(ca)
            trusting_others = replication_client_context(follower_cert, follower_key, str(pki["other-ca"][0]))
            for name, context in (("plain TCP", None), ("no certificate", no_cert),
                                  ("another CA's certificate", stranger),
                                  ("leader not trusted", trusting_others)):
                client = ReplicationClient(tmp_path / name, SECRET, name, "127.0.0.1", port, context)
                results[name] = await _follow(client, isr, name, 5)
            good = replication_client_context(follower_cert, follower_key, ca)
            results["the CA's certificate"] = await _follow(
                ReplicationClient(tmp_path / "good", SECRET, "good", "127.0.0.1", port, good), isr, "good")
            results["files synced"] = (tmp_path / "good" / "users.json").read_bytes() == \
                (tmp_path / "leader" / "users.json").read_bytes()
            return results
        finally:
            await _stop(server, broker)
    results = asyncio.run(run())
    assert results == {"plain TCP": False, "no certificate": False, "another CA's certificate": False,
                       "leader not trusted": False, "the CA's certificate": True, "files synced": True}


def test_admission_counts_each_connection_once_and_caps_all_addresses_together() -> None:
    gate = admission.HandshakeAdmission(per_address=2, total=3)
    tickets = [gate.admit(f"10.0.0.{i}") for i in range(3)]
    assert all(tickets) and gate.pending == 3
    assert gate.admit("10.0.0.9") is None  # the total is reached
    first = tickets[0]
    assert first is not None
    first.release()
    first.release()  # a second release gives nothing back twice
    assert gate.pending == 2
    assert gate.admit("10.0.0.1") is not None  # 10.0.0.1 had one: two are allowed
    assert gate.admit("10.0.0.1") is None  # per address, and the total again
