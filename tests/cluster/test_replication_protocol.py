"""The replication protocol: framing, operations, HMAC authentication both ways, a wrong secret
refused and logged, the secret never on the wire, and operations that can be applied twice."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lavinpy import config as config_module
from lavinpy.broker.broker import Broker
from lavinpy.cluster import replication_protocol as proto
from lavinpy.cluster.errors import ReplicationRefused
from lavinpy.cluster.file_applier import FileApplier
from lavinpy.cluster.replication_client import ReplicationClient
from lavinpy.cluster.replication_server import ReplicationServer

from .replication_harness import SECRET, MemoryIsr, replicated_hashes

pytestmark = pytest.mark.timeout(60)


# ---- framing and operations ----------------------------------------------------------------------

def test_frames_split_anywhere_decode_the_same() -> None:
    frames = [proto.frame(proto.ACK, proto.pack_u64(7)), proto.frame(proto.FILE_CHUNK, b"x" * 1000),
              proto.frame(proto.AUTH_OK)]
    data = b"".join(frames)
    for cut in range(len(data) + 1):
        decoder = proto.FrameDecoder()
        got = decoder.feed(data[:cut]) + decoder.feed(data[cut:])
        assert got == [(proto.ACK, proto.pack_u64(7)), (proto.FILE_CHUNK, b"x" * 1000), (proto.AUTH_OK, b"")]
        assert decoder.buffered == 0


def test_an_oversized_or_empty_frame_is_a_protocol_error() -> None:
    with pytest.raises(proto.ProtocolError):
        proto.FrameDecoder(max_frame=100).feed((101).to_bytes(4, "big") + b"\x01")
    with pytest.raises(proto.ProtocolError):
        proto.FrameDecoder().feed((0).to_bytes(4, "big") + b"\x01")


@pytest.mark.parametrize("kind,kwargs", [
    (proto.OP_WRITE, {"offset": 1 << 40, "data": b"abc"}), (proto.OP_REPLACE, {"data": b"[1]\n"}),
    (proto.OP_TRUNCATE, {"size": 8 << 20}), (proto.OP_DELETE, {}), (proto.OP_RMDIR, {})])
def test_operations_round_trip_and_their_length_is_the_stream_offset_step(kind: int, kwargs: dict) -> None:
    path = "0a1b/ü-queue/enq"
    encoded = proto.op(1234, kind, path, **kwargs)
    assert len(encoded) == proto.op_frame_length(path, len(kwargs.get("data", b"")), kind)
    [(frame_kind, payload)] = proto.FrameDecoder().feed(encoded)
    assert frame_kind == proto.OP
    assert proto.parse_op(payload) == proto.Operation(1234, kind, path, **kwargs)


@pytest.mark.parametrize("path", ["../etc/passwd", "/abs", "a/../../b", "", "a//b", ".lock", "vh/x.tmp"])
def test_paths_outside_the_data_dir_or_local_only_are_refused(path: str) -> None:
    with pytest.raises(proto.ProtocolError):
        proto.check_path(path)


def test_proofs_depend_on_the_secret_the_nonces_and_the_role() -> None:
    a, b = proto.new_nonce(), proto.new_nonce()
    assert a != b and len(a) == proto.NONCE_SIZE
    leader = proto.leader_proof(SECRET, a, b)
    assert leader == proto.leader_proof(SECRET, a, b)
    assert leader != proto.leader_proof(b"another secret", a, b)
    assert leader != proto.leader_proof(SECRET, b, a)
    assert leader != proto.follower_proof(SECRET, a, b, "")  # a proof cannot be reflected back
    assert proto.follower_proof(SECRET, a, b, "n1") != proto.follower_proof(SECRET, a, b, "n2")


_ops = st.lists(st.one_of(
    st.builds(lambda f, o, d: (proto.OP_WRITE, f, {"offset": o, "data": d}),
              st.sampled_from(["a", "d/b"]), st.integers(0, 64), st.binary(min_size=1, max_size=16)),
    st.builds(lambda f, d: (proto.OP_REPLACE, f, {"data": d}), st.sampled_from(["a", "d/b"]), st.binary(max_size=16)),
    st.builds(lambda f, s: (proto.OP_TRUNCATE, f, {"size": s}), st.sampled_from(["a", "d/b"]), st.integers(0, 80)),
    st.builds(lambda f: (proto.OP_DELETE, f, {}), st.sampled_from(["a", "d/b"])),
    st.just((proto.OP_RMDIR, "d", {}))), max_size=12)


@settings(max_examples=60, deadline=None)
@given(_ops, st.data())
def test_replaying_a_suffix_of_the_stream_again_leaves_the_same_files(tmp_path_factory, ops, data) -> None:
    """What makes full sync + stream exact: files read at any point after the follower registered,
    then every operation since registration applied, equal the leader's files."""
    operations = [proto.Operation(i, kind, path, **kw) for i, (kind, path, kw) in enumerate(ops)]
    once, twice = tmp_path_factory.mktemp("once"), tmp_path_factory.mktemp("twice")
    applier = FileApplier(once)
    for operation in operations:
        applier.apply(operation)
    applier.commit()
    cut = data.draw(st.integers(0, len(operations)))
    replay = FileApplier(twice)
    for operation in operations[:cut] + operations:  # a snapshot taken after `cut` ops, then all of them
        replay.apply(operation)
    replay.commit()
    assert _tree(twice) == _tree(once)


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# ---- authentication over TCP, with the bytes captured ----------------------------------------------

class Recorder:
    """A TCP relay between follower and leader that keeps every byte sent either way."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.captured = bytearray()
        self.server: asyncio.base_events.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while data := await src.read(65536):
                self.captured += data
                dst.write(data)
                await dst.drain()
            dst.close()
        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer), return_exceptions=True)


async def _leader(tmp_path: Path) -> tuple[ReplicationServer, Broker, MemoryIsr]:
    broker = Broker(config_module.load(None, env={}, overrides={"data_dir": str(tmp_path / "leader")}))
    isr = MemoryIsr()
    server = ReplicationServer(tmp_path / "leader", SECRET, "leader", isr, "127.0.0.1", 0)
    await server.start()
    server.attach(broker)
    broker.open()
    broker.vhosts["/"].declare_queue("q", owner=None, durable=True)
    return server, broker, isr


def test_the_right_secret_syncs_and_never_crosses_the_wire(tmp_path: Path) -> None:
    async def run() -> bytes:
        server, broker, isr = await _leader(tmp_path)
        recorder = Recorder(server.port)
        await recorder.start()
        client = ReplicationClient(tmp_path / "follower", SECRET, "f1", "127.0.0.1", recorder.port)
        task = asyncio.ensure_future(client.run())
        for _ in range(200):
            if isr.members == ["leader", "f1"] and server.follower_status()[0]["lag_bytes"] == 0:
                break
            await asyncio.sleep(0.05)
        assert isr.members == ["leader", "f1"]
        assert client.in_sync
        await client.close()
        await task
        await server.stop()
        broker.close()
        return bytes(recorder.captured)
    captured = asyncio.run(run())
    assert b"q" in captured and len(captured) > 1000  # the files went through the relay
    for form in (SECRET, SECRET.hex().encode(), hashlib.sha256(SECRET).digest()):
        assert form not in captured
    # close() left the follower with the leader's files (the leader closed cleanly after it)
    assert (tmp_path / "follower" / "users.json").read_bytes() == (tmp_path / "leader" / "users.json").read_bytes()
    assert set(replicated_hashes(tmp_path / "follower")) <= set(replicated_hashes(tmp_path / "leader"))


def test_a_wrong_secret_is_refused_and_logged_with_the_peer_address(tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="lavinpy.cluster.replication")

    async def run() -> tuple[ReplicationRefused, ReplicationRefused, MemoryIsr]:
        server, broker, isr = await _leader(tmp_path)
        try:
            wrong = ReplicationClient(tmp_path / "f", b"not the secret", "intruder", "127.0.0.1", server.port)
            with pytest.raises(ReplicationRefused) as refused_by_follower:
                await wrong.run()  # the leader's proof does not check out with the follower's secret
            # a follower whose secret is wrong cannot prove itself either: send a bad proof by hand
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            nonce = proto.new_nonce()
            writer.write(proto.hello("intruder", nonce))
            decoder = proto.FrameDecoder()
            kind, payload = await proto.next_frame(reader, decoder)
            assert kind == proto.CHALLENGE
            leader_nonce, _ = proto.parse_challenge(payload)
            writer.write(proto.frame(proto.AUTH, proto.follower_proof(b"guess", nonce, leader_nonce, "intruder")))
            kind, payload = await proto.next_frame(reader, decoder)
            local = writer.get_extra_info("sockname")
            writer.close()
            assert kind == proto.REFUSED
            assert await reader.read() == b""  # and the leader hung up
            return refused_by_follower.value, local, isr
        finally:
            await server.stop()
            broker.close()
    refused, local, isr = asyncio.run(run())
    assert "prove" in str(refused)
    assert isr.members == ["leader"]
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert any(f"127.0.0.1:{local[1]}" in line and "wrong shared secret" in line for line in lines), lines
    assert not (tmp_path / "f" / "users.json").exists()


@pytest.mark.parametrize("bad", ["ack beyond the bytes sent", "not an ack"])
def test_a_streaming_follower_that_breaks_the_protocol_is_dropped(bad: str, tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="lavinpy.cluster.replication")

    async def run() -> tuple[list[str], list[str], bytes]:
        server, broker, isr = await _leader(tmp_path)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            decoder = proto.FrameDecoder()
            nonce = proto.new_nonce()
            writer.write(proto.hello("f1", nonce))
            kind, payload = await proto.next_frame(reader, decoder)
            leader_nonce, _ = proto.parse_challenge(payload)
            writer.write(proto.frame(proto.AUTH, proto.follower_proof(SECRET, nonce, leader_nonce, "f1")))
            assert (await proto.next_frame(reader, decoder))[0] == proto.AUTH_OK
            writer.write(proto.file_list({}))
            while (frame := await proto.next_frame(reader, decoder))[0] != proto.SYNC_END:
                pass
            writer.write(proto.frame(proto.ACK, frame[1]))  # caught up with its sync: it joins the ISR
            acked = proto.unpack_u64(frame[1])
            for _ in range(100):  # acknowledging what the leader streams meanwhile (its join's epoch)
                if isr.members == ["leader", "f1"]:
                    break
                try:
                    kind, payload = await asyncio.wait_for(proto.next_frame(reader, decoder), 0.02)
                except TimeoutError:
                    continue
                if kind == proto.OP:
                    acked = proto.parse_op(payload).end
                    writer.write(proto.frame(proto.ACK, proto.pack_u64(acked)))
            joined = list(isr.members)
            if bad == "not an ack":
                writer.write(proto.hello("f1", nonce))
            else:
                writer.write(proto.frame(proto.ACK, proto.pack_u64(acked + 10**6)))
            rest = await asyncio.wait_for(reader.read(), 5)  # the leader hangs up
            for _ in range(100):
                if isr.members == ["leader"]:
                    break
                await asyncio.sleep(0.02)
            writer.close()
            return joined, list(isr.members), rest
        finally:
            await server.stop()
            broker.close()

    joined, after, _ = asyncio.run(run())
    assert joined == ["leader", "f1"]
    assert after == ["leader"]
    assert any("f1" in r.getMessage() and "dropped" in r.getMessage() and "ProtocolError" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_close_ends_a_follower_waiting_on_a_silent_leader(tmp_path: Path) -> None:
    async def run() -> float:
        held: list[asyncio.StreamWriter] = []  # Python 3.13 closes a stream writer nobody holds
        silent = await asyncio.start_server(lambda r, w: held.append(w), "127.0.0.1", 0)  # accepts, never answers
        port = silent.sockets[0].getsockname()[1]
        client = ReplicationClient(tmp_path / "f", SECRET, "f1", "127.0.0.1", port)
        task = asyncio.ensure_future(client.run())
        await asyncio.sleep(0.3)
        assert not task.done()  # waiting for the leader's challenge in its thread
        started = asyncio.get_running_loop().time()
        await asyncio.wait_for(client.close(), 5)
        await asyncio.wait_for(task, 5)  # ends without an error: it was closed
        silent.close()
        return asyncio.get_running_loop().time() - started

    assert asyncio.run(run()) < 1.0
