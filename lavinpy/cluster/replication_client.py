"""The follower's side of replication: authenticate, full sync, then apply the leader's stream.

Every read from the socket, with what arrived while its operations were written, is one batch: its
operations are applied, the touched files and directories fsynced, and only then the stream offset
acknowledged, all in the connection's own thread
(so that the node's proxies keep running on the event loop and the loop takes no part in a batch).
After the full sync and the stream the data directory holds exactly the leader's durable files;
when this node later leads, opening it is the normal crash recovery.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import struct
import threading
import time
from pathlib import Path

from . import replica_state
from . import replication_protocol as proto
from .errors import ReplicationRefused
from .file_applier import FileApplier, ReplicaDiskError

log = logging.getLogger("lavinpy.cluster.replication")

READ_SIZE = 4 * 1024 * 1024
# A batch takes in what arrives while it is written until it holds this many bytes, then is fsynced.
DRAIN_BYTES = 4 * 1024 * 1024
# A connect cannot be interrupted by close(): a node elected while its client connects to a vanished
# leader waits this long before it can serve.
CONNECT_TIMEOUT = 2.0
# The leader sends a heartbeat every second when idle: this long without a byte means the link is dead
# (a silent partition), and the follower reconnects. A full sync may pause longer while the leader
# hashes large files.
STREAM_READ_TIMEOUT = 5.0
SYNC_READ_TIMEOUT = 60.0


class ReplicationClient:
    """The follower's replication connection, run by one thread of its own with a blocking socket.

    A batch goes socket -> files -> fsync -> acknowledgement without a turn of the event loop or a
    hand-over between threads: the loop is the follower's client proxy, and every turn it took on
    this path delayed the leader's confirms. ``run()`` and ``close()`` are the asyncio face.
    """

    def __init__(self, data_dir: Path, secret: bytes, node_id: str, leader_host: str, leader_port: int,
                 tls: ssl.SSLContext | None = None) -> None:
        """``tls``: a client context that verifies the leader's certificate (and presents this node's);
        None: plain TCP."""
        self.data_dir = Path(data_dir)
        self._tls = tls
        self._secret = secret
        self.node_id = node_id
        self.leader_host = leader_host
        self.leader_port = leader_port
        self.in_sync = False  # full sync done and the stream applied as it arrives
        self.bytes_applied = 0  # full-sync file bytes and stream bytes written to disk
        self.acked = 0  # the stream offset last acknowledged
        self.up_since: float | None = None  # monotonic time the leader authenticated (None: not up)
        self.streamed = False  # the full sync completed and the stream began
        self._sock: socket.socket | None = None
        self._closing = False
        self._finished: asyncio.Future[None] | None = None  # resolved when the thread has ended

    async def run(self) -> None:
        """Connect, authenticate, full-sync, then apply the stream until the connection ends.

        Raises ReplicationRefused when the leader refuses the secret or fails to prove it knows it.
        """
        self._closing = False
        loop = asyncio.get_running_loop()
        finished = self._finished = loop.create_future()

        def thread() -> None:
            try:
                self._run()
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
                loop.call_soon_threadsafe(_settle, finished, exc)
            else:
                loop.call_soon_threadsafe(_settle, finished, None)

        threading.Thread(target=thread, name="replication-client", daemon=True).start()
        try:
            await asyncio.shield(finished)
        except asyncio.CancelledError:
            self._closing = True
            self._shutdown()  # the thread ends at its next read; close() waits for it
            raise

    async def close(self) -> None:
        """Stop; on return everything received so far is applied and fsynced."""
        self._closing = True
        self._shutdown()
        if self._finished is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._finished)

    def _shutdown(self) -> None:
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                # The plain socket's shutdown, also under TLS: SSLSocket's own drops its TLS state,
                # which the thread may be reading with.
                socket.socket.shutdown(sock, socket.SHUT_RDWR)

    # ---- the thread ---------------------------------------------------------------------------------

    def _run(self) -> None:
        sock = socket.create_connection((self.leader_host, self.leader_port), timeout=CONNECT_TIMEOUT)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # an acknowledgement goes at once
        proto.tune_socket(sock)
        self._sock = sock
        if self._closing:  # close() came while connecting
            self._shutdown()
        link = _Link(sock)
        applier = FileApplier(self.data_dir, before_discard=self._not_consistent)
        try:
            if self._tls is not None:
                sock = self._sock = link.start_tls(self._tls, self.leader_host)
            sock.settimeout(SYNC_READ_TIMEOUT)
            self._authenticate(link)
            link.decoder.max_frame = proto.MAX_FRAME
            self.up_since = time.monotonic()
            self._full_sync(link, applier)
            self.in_sync = self.streamed = True
            if self._tls is None:
                _kernel_timeouts(sock, STREAM_READ_TIMEOUT)
            else:  # an SSL read of a blocking socket would wait in poll() without a timeout
                sock.settimeout(STREAM_READ_TIMEOUT)
            self._stream(link, applier)
        except proto.ProtocolError as exc:
            log.error("replication: leader %s:%d sent something unexpected: %s", self.leader_host,
                      self.leader_port, exc)
        except ReplicaDiskError:  # logged by the applier; nothing acknowledged, and the connection
            raise  # closes below: the leader drops this follower, which must full-sync again
        except OSError as exc:  # ConnectionError among them
            if not self._closing:
                log.warning("replication: connection to the leader %s:%d ended: %s",
                            self.leader_host, self.leader_port, exc)
        finally:
            self.in_sync = False
            self.up_since = None
            try:
                applier.abort()
            finally:
                self._sock = None
                sock.close()

    def _not_consistent(self) -> None:
        """Before a disk fault makes the applier delete what it cannot prove: this copy may no longer
        lead until a full sync has completed again."""
        replica_state.write(self.data_dir, replica_state.SYNCING)

    def _authenticate(self, link: _Link) -> None:
        nonce = proto.new_nonce()
        link.send(proto.hello(self.node_id, nonce))
        kind, payload = link.next_frame()
        if kind == proto.REFUSED:
            raise ReplicationRefused(f"leader refused: {proto.unpack_str(payload, 0)[0]}")
        if kind != proto.CHALLENGE:
            raise proto.ProtocolError(f"expected a challenge, got frame type {kind}")
        leader_nonce, proof = proto.parse_challenge(payload)
        if not proto.proof_matches(proto.leader_proof(self._secret, nonce, leader_nonce), proof):
            log.warning("replication: leader %s:%d does not know the shared secret", self.leader_host,
                        self.leader_port)
            raise ReplicationRefused("the leader failed to prove the shared secret")
        link.send(proto.frame(proto.AUTH, proto.follower_proof(self._secret, nonce, leader_nonce, self.node_id)))
        kind, payload = link.next_frame()
        if kind == proto.REFUSED:
            reason = proto.unpack_str(payload, 0)[0]
            log.warning("replication: leader %s:%d refused this node: %s", self.leader_host, self.leader_port,
                        reason)
            raise ReplicationRefused(f"leader refused: {reason}")
        if kind != proto.AUTH_OK:
            raise proto.ProtocolError(f"expected auth-ok, got frame type {kind}")

    def _full_sync(self, link: _Link, applier: FileApplier) -> None:
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Before the first file changes: a copy half-way through a sync must never lead.
        replica_state.write(self.data_dir, replica_state.SYNCING)
        link.send(proto.file_list(proto.list_files(self.data_dir)))
        while True:
            kind, payload = link.next_frame()
            if kind == proto.DELETE_LIST:
                for rel in proto.parse_delete_list(payload):
                    applier.delete(rel)  # a few unlinks; their directories are fsynced at the end
            elif kind == proto.FILE_START:
                rel, pos = proto.unpack_str(payload, 0)
                applier.begin_file(rel, proto.unpack_u64(payload, pos))
            elif kind == proto.FILE_CHUNK:
                applier.file_chunk(payload)
                self.bytes_applied += len(payload)
            elif kind == proto.FILE_END:
                applier.end_file()
            elif kind == proto.SYNC_END:
                applier.commit()
                replica_state.write(self.data_dir, replica_state.CONSISTENT)
                self.acked = proto.unpack_u64(payload)
                link.send(proto.frame(proto.ACK, proto.pack_u64(self.acked)))
                log.info("replication: full sync from %s:%d done", self.leader_host, self.leader_port)
                return
            else:
                raise proto.ProtocolError(f"unexpected frame type {kind} during full sync")

    def _stream(self, link: _Link, applier: FileApplier) -> None:
        while True:
            frames = link.frames()  # all that arrived: one batch, one fsync, one acknowledgement
            if frames is None:
                return
            operations: list[proto.Operation] = []
            end, epoch = _take_operations(frames, operations, -1, -1)
            if end < 0:
                continue
            if operations:
                for operation in operations:
                    applier.apply(operation)
                applied = sum(len(op.data) for op in operations)
                # What arrived while these were written joins the batch before its fsync: a flush's
                # index entries, sent just behind its segment bytes, were otherwise often read alone
                # after the segment's fsync and cost that flush a second fsync and round trip.
                while applied < DRAIN_BYTES:
                    more = link.frames_ready()
                    if not more:
                        break
                    operations.clear()
                    end, epoch = _take_operations(more, operations, end, epoch)
                    for operation in operations:
                        applier.apply(operation)
                    applied += sum(len(op.data) for op in operations)
                applier.commit()
                self.bytes_applied += applied
            elif applier.acks_due():  # an idle stream: its heartbeat brings the ack files' fsync
                applier.commit()
            if epoch >= 0:  # after the batch's files are durable: this copy holds that position
                replica_state.write(self.data_dir, replica_state.CONSISTENT, epoch)
            self.acked = end
            link.send(proto.frame(proto.ACK, proto.pack_u64(self.acked)))


def _take_operations(frames: list[tuple[int, bytes]], operations: list[proto.Operation], end: int,
                     epoch: int) -> tuple[int, int]:
    """Parse a read's frames: the file operations into ``operations``; returns the stream offset after
    the last frame and the last epoch stamp among them (``end`` and ``epoch`` if none)."""
    for kind, payload in frames:
        if kind != proto.OP:
            raise proto.ProtocolError(f"expected an operation, got frame type {kind}")
        operation = proto.parse_op(payload)
        end = operation.end
        if operation.kind == proto.OP_EPOCH:
            epoch = proto.unpack_u64(operation.data)
        elif operation.kind != proto.OP_HEARTBEAT:
            operations.append(operation)
    return end, epoch


class _Link:
    """Frames over a blocking socket."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = bytearray(READ_SIZE)
        self._view = memoryview(self._buffer)
        self.decoder = proto.FrameDecoder(max_frame=proto.HANDSHAKE_MAX_FRAME)  # raised once authenticated
        self._tls = False

    def start_tls(self, context: ssl.SSLContext, host: str) -> ssl.SSLSocket:
        """TLS over the connection (the handshake within CONNECT_TIMEOUT): the leader's certificate must
        name ``host`` and chain to the context's CA."""
        self._sock.settimeout(CONNECT_TIMEOUT)
        self._sock = context.wrap_socket(self._sock, server_hostname=host)
        self._tls = True
        return self._sock

    def send(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except BlockingIOError as exc:  # SO_SNDTIMEO ran out (_kernel_timeouts)
            raise TimeoutError("timed out") from exc

    def _receive(self) -> int:
        """Read what has arrived into the buffer. A TLS read returns one record (16 KiB at most): the
        records already there are read too, so that a batch is not cut into many (one fsync each)."""
        try:
            received = self._sock.recv_into(self._buffer)
        except BlockingIOError as exc:  # SO_RCVTIMEO ran out (_kernel_timeouts)
            raise TimeoutError("timed out") from exc
        if not received or not self._tls:
            return received
        timeout = self._sock.gettimeout()
        self._sock.settimeout(0.0)
        try:
            while received < len(self._buffer):
                more = self._sock.recv_into(self._view[received:])
                if not more:
                    break
                received += more
        except (ssl.SSLWantReadError, BlockingIOError):
            pass
        finally:
            self._sock.settimeout(timeout)
        return received

    def frames(self) -> list[tuple[int, bytes]] | None:
        """The frames decoded but not taken yet, else those of the next read; None at the end."""
        decoder = self.decoder
        if decoder.pending:
            frames, decoder.pending = decoder.pending, []
            return frames
        received = self._receive()
        if not received:
            return None
        return decoder.feed(self._view[:received])

    def frames_ready(self) -> list[tuple[int, bytes]]:
        """The frames of what has arrived already, without waiting (none under TLS, whose reads of a
        record may wait). The end of the connection is left to the next ``frames()``."""
        decoder = self.decoder
        if decoder.pending:
            frames, decoder.pending = decoder.pending, []
            return frames
        if self._tls:
            return []
        try:
            received = self._sock.recv_into(self._buffer, 0, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return []
        if not received:
            return []
        return decoder.feed(self._view[:received])

    def next_frame(self) -> tuple[int, bytes]:
        pending = self.decoder.pending
        while not pending:
            frames = self.frames()
            if frames is None:
                raise ConnectionResetError("connection closed by the peer")
            pending.extend(frames)
        return pending.pop(0)


def _kernel_timeouts(sock: socket.socket, seconds: float) -> None:
    """A blocking socket whose reads and writes time out in the kernel (SO_RCVTIMEO, SO_SNDTIMEO): a
    socket with a Python timeout polls before every recv and send, two more system calls a batch."""
    sock.settimeout(None)
    whole = int(seconds)
    value = struct.pack("ll", whole, int((seconds - whole) * 1_000_000))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
