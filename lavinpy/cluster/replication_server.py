"""The leader's side of replication: authenticates followers, full-syncs them, streams every durable
file change to them, keeps the in-sync replica set (ISR) in etcd, and holds confirms until every ISR
follower acknowledged the bytes (the store's replication barrier).

Order of a follower's life: authenticated -> registered (operations buffered for it from now on) ->
full sync (files that differ, deletions) -> streaming (buffered operations first) -> caught up with
its full sync's end: into the confirm barrier (no later confirm goes out without it) -> caught up with
the stream's end at that moment, so it holds everything ever confirmed: written into etcd's ISR. Only
then may etcd elect it.
It is dropped (connection closed) when its connection ends, when it leaves data unacknowledged for
``ACK_TIMEOUT`` seconds (the stream carries a heartbeat every ``HEARTBEAT_INTERVAL`` when idle, so a
silent follower is noticed even then), or when more than ``MAX_BACKLOG`` bytes wait for it; it leaves
the barrier only once etcd's ISR no longer names it, and then has to connect and full-sync again.

Epochs: while files change, the leader stamps a new epoch into it every ``EPOCH_INTERVAL``
(and when a follower joins); once every follower etcd names has acknowledged an epoch, it is written
to etcd with the ISR. A node whose copy holds an older epoch than etcd's (a data dir restored from an
old backup) may not lead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ..wire.accel import SOCKET_THREADS, csocket
from . import replication_protocol as proto
from .admission import HandshakeAdmission, Ticket
from .errors import LeadershipLost
from .files import is_local_only
from .replication_listener import ReplicationListener

log = logging.getLogger("lavinpy.cluster.replication")

ACK_TIMEOUT = 3.0  # seconds a follower may leave sent data unacknowledged
HEARTBEAT_INTERVAL = 1.0  # an idle stream carries a heartbeat this often
EPOCH_INTERVAL = 1.0  # a moving stream gets a new epoch this often
MAX_BACKLOG = 256 * 1024 * 1024  # bytes buffered for one follower before it is dropped
# A follower proves the secret in two round trips: a connection that has not within this time (TLS
# handshake included) is closed.
HANDSHAKE_TIMEOUT = 3.0
# A streaming follower's sends go through a thread that never takes the GIL (plain TCP, compiled
# build): on loopback a send() also runs the receiver's TCP processing, and the loop did it for every
# follower before a group commit's own fsync could start (bench/history.md, issue 31).
THREAD_WRITER = csocket is not None and "writer" in SOCKET_THREADS
WRITER_HIGH_WATER = 8 * 1024 * 1024  # a writer thread's unsent bytes before the sender task waits
WRITER_POLL_SECONDS = 0.002  # how often a sender above the high-water mark looks at the thread's backlog


class IsrWriter(Protocol):
    async def write_isr(self, members: list[str], epoch: int = 0) -> None:
        """Record the in-sync replica set and the epoch they all hold (fenced: raises LeadershipLost if
        this node no longer leads)."""


class _Follower:
    def __init__(self, node_id: str, address: str, writer: asyncio.StreamWriter, position: int) -> None:
        self.id = node_id
        self.address = address
        self.writer = writer
        self.start = position  # stream offset its buffered operations start at
        self.sent = position
        self.acked = position
        self.join_target = -1  # the stream offset it must acknowledge for its next join step
        self.queue: deque[bytes] = deque()
        self.queued_bytes = 0
        self.wake = asyncio.Event()
        self.writable = asyncio.Event()  # its connection takes more bytes (flow control)
        self.writable.set()
        self.streaming = False
        self.joining = False  # in the barrier, catching up with join_target before etcd names it
        self.joined = False  # named in etcd's ISR
        self.writing_isr = False
        self.last_progress = time.monotonic()
        self.dropped = False
        self.sync_bytes = 0  # full-sync file bytes sent
        self.thread_fd = -1  # the socket a writer thread may send the stream on (THREAD_WRITER)
        self.thread_writer: Any = None  # csocket.SocketWriter, once the transport's buffer was empty


class ReplicationServer:
    """Implements the store's FileChanges (the operations) and ReplicationBarrier (the confirms)."""

    def __init__(self, data_dir: Path, secret: bytes, node_id: str, isr: IsrWriter, host: str, port: int,
                 serving: Callable[[], bool] = lambda: True, epoch: int = 0,
                 tls: ssl.SSLContext | None = None) -> None:
        """``tls``: a server context that requires and verifies the followers' certificates (None:
        plain TCP)."""
        self.data_dir = Path(data_dir)
        self._tls = tls
        self.admission = HandshakeAdmission()
        self.handshake_timeout = HANDSHAKE_TIMEOUT
        self._secret = secret
        self.node_id = node_id
        self._isr_writer = isr
        self.host = host
        self.port = port
        self.max_backlog = MAX_BACKLOG
        self.ack_timeout = ACK_TIMEOUT
        self.heartbeat_interval = HEARTBEAT_INTERVAL
        self._serving = serving  # False once this node's lease may have run out: nothing is released
        self.epoch = epoch  # the last epoch stamped into the stream
        self._epoch_end = -1  # where that stamp ends in the stream
        self._recorded_epoch = epoch  # the last epoch written to etcd
        self._recording = False
        self._server: ReplicationListener | None = None
        self._followers: dict[str, _Follower] = {}  # registered: operations are buffered for them
        self._isr: dict[str, _Follower] = {}  # the barrier waits for these (a superset of etcd's ISR)
        self._isr_lock = asyncio.Lock()
        self._log_end = 0  # stream offset after the last operation
        self._changed_end = 0  # ... after the last file change: an idle stream (heartbeats) gets no new epoch
        self._waiters: list[tuple[int, Callable[[], None]]] = []
        self._attached = asyncio.Event()
        self._broker: Any = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._monitor: asyncio.Task[None] | None = None
        self.leadership_lost = False

    # ---- life cycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Record ISR = [this node], then listen for followers."""
        await self._isr_writer.write_isr([self.node_id])
        self._server = ReplicationListener(self._serve, self.admission, self._tls, lambda: self.handshake_timeout)
        self.port = await self._server.start(self.host, self.port)
        self._monitor = asyncio.get_running_loop().create_task(self._watch_acks())
        log.info("replication: listening on %s:%d%s", self.host, self.port, " (TLS)" if self._tls else "")

    def attach(self, broker: Any) -> None:
        """Report the broker's durable file changes to the followers and make its flushes wait for them.

        Followers are full-synced only from now on: changes made before were not reported.
        """
        self._broker = broker
        broker.set_replication(self, self)
        self._attached.set()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._monitor is not None:
            self._monitor.cancel()
        if self._broker is not None:
            self._broker.set_replication(None, None)
            self._broker = None
        for follower in list(self._followers.values()):
            self._close(follower)
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        # Waiters stay pending: a stopped leader confirms nothing more.

    def follower_status(self) -> list[dict]:
        return [{"id": f.id, "address": f.address, "bytes_sent": f.sent, "bytes_acked": f.acked,
                 "lag_bytes": self._log_end - f.acked, "in_sync": self._isr.get(f.id) is f and f.joined}
                for f in self._followers.values()]

    @property
    def isr(self) -> list[str]:
        """The members etcd's ISR should name: this node and the followers whose join completed."""
        return [self.node_id, *sorted(i for i, f in self._isr.items() if f.joined)]

    # ---- FileChanges: the store reports, we encode once and queue for every follower ------------

    def _emit(self, kind: int, rel: str, *, offset: int = 0, size: int = 0, data: bytes = b"") -> None:
        if not self._followers or is_local_only(rel.rpartition("/")[2]):
            return
        end = self._log_end + proto.op_frame_length(rel, len(data), kind)
        encoded = proto.op(end, kind, rel, offset=offset, size=size, data=data)
        self._log_end = end
        if kind != proto.OP_HEARTBEAT and kind != proto.OP_EPOCH:
            self._changed_end = end
        for follower in list(self._followers.values()):
            follower.queue.append(encoded)
            follower.queued_bytes += len(encoded)
            if follower.queued_bytes > self.max_backlog:
                self._drop_later(follower, f"more than {self.max_backlog} bytes behind")
            elif follower.streaming:
                follower.wake.set()

    def file_appended(self, rel_path: str, offset: int, data: bytes) -> None:
        self._emit(proto.OP_WRITE, rel_path, offset=offset, data=data)

    def file_replaced(self, rel_path: str, data: bytes) -> None:
        self._emit(proto.OP_REPLACE, rel_path, data=data)

    def file_truncated(self, rel_path: str, size: int) -> None:
        self._emit(proto.OP_TRUNCATE, rel_path, size=size)

    def file_deleted(self, rel_path: str) -> None:
        self._emit(proto.OP_DELETE, rel_path)

    def dir_deleted(self, rel_path: str) -> None:
        self._emit(proto.OP_RMDIR, rel_path)

    # ---- ReplicationBarrier ----------------------------------------------------------------------

    def wait_replicated(self) -> asyncio.Future[None]:
        """Resolves once every ISR follower acknowledged the stream up to its end at this call."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def resolve() -> None:
            if not future.done():
                future.set_result(None)

        self.on_replicated(resolve)
        return future

    def on_replicated(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once every ISR follower acknowledged the stream up to its end at this call."""
        target = self._log_end
        for follower in self._followers.values():
            # A flush waits on this: its operations go out now rather than on the sender task's next turn.
            if follower.streaming and not follower.dropped and follower.queue and self._idle_enough(follower):
                self._write_queued(follower)
        if not self._waiters and self._released(target) and self._serving():
            callback()
        else:
            self._waiters.append((target, callback))

    def _released(self, target: int) -> bool:
        return all(f.acked >= target for f in self._isr.values())

    def _release(self) -> None:
        """Call back, in order, whoever waited for what the ISR has now acknowledged."""
        if not self._serving():
            return  # the node is stepping down: what waits is never confirmed by this leader
        waiters = self._waiters
        released = 0
        while released < len(waiters) and self._released(waiters[released][0]):
            released += 1
        if not released:
            return
        self._waiters = waiters[released:]
        for _, callback in waiters[:released]:
            callback()

    # ---- ISR ---------------------------------------------------------------------------------------

    def _stamp_epoch(self) -> None:
        self.epoch += 1
        self._emit(proto.OP_EPOCH, "", data=proto.pack_u64(self.epoch))
        self._epoch_end = self._log_end

    def _held(self, end: int) -> bool:
        """Whether every follower etcd names has acknowledged the stream up to ``end``."""
        return all(f.acked >= end for f in self._isr.values() if f.joined)

    async def _record_epoch(self, epoch: int, end: int) -> None:
        async with self._isr_lock:
            # Checked again: a follower may have joined while this waited for the lock.
            if epoch > self._recorded_epoch and self._held(end):
                saved, self._recorded_epoch = self._recorded_epoch, epoch
                if not await self._write_isr():
                    self._recorded_epoch = saved
        self._recording = False

    async def _write_isr(self) -> bool:
        try:
            await self._isr_writer.write_isr(self.isr, self._recorded_epoch)
            return True
        except LeadershipLost:
            self.leadership_lost = True
            log.error("replication: leadership lost while writing the ISR; confirms stop")
            return False

    def _join_step(self, follower: _Follower) -> None:
        """Called as its acknowledgements arrive: the follower's next step towards etcd's ISR."""
        if follower.acked < follower.join_target or follower.dropped:
            return
        if not follower.joining:
            # Into the barrier now: no confirm from here on goes out without it. Confirms already
            # sent may cover bytes it has not acknowledged yet, so etcd names it only once it has
            # acknowledged the stream's end as of this moment.
            follower.joining = True
            self._isr[follower.id] = follower
            self._stamp_epoch()  # so that it holds an epoch at least as new as etcd's when etcd names it
            follower.join_target = self._log_end
            if follower.acked < follower.join_target:
                return
        if not follower.joined and not follower.writing_isr:
            follower.writing_isr = True
            self._spawn(self._join_isr(follower))

    async def _join_isr(self, follower: _Follower) -> None:
        async with self._isr_lock:
            if follower.dropped or self._isr.get(follower.id) is not follower:
                return
            follower.joined = True
            if await self._write_isr():
                log.info("replication: follower %s (%s) is in sync", follower.id, follower.address)
            else:
                follower.joined = False

    async def _leave_isr(self, follower: _Follower) -> None:
        async with self._isr_lock:
            if self._isr.get(follower.id) is not follower:
                return
            if follower.joined:
                # etcd first: while it may still elect this follower, every confirm waits for it.
                follower.joined = False
                if not await self._write_isr():
                    follower.joined = True
                    return
            # While etcd was written the same node may have connected again and entered the barrier
            # with its new connection: that entry stays (removing it kept the node out of the ISR).
            if self._isr.get(follower.id) is follower:
                del self._isr[follower.id]
        self._release()

    # ---- followers ---------------------------------------------------------------------------------

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _drop_later(self, follower: _Follower, reason: str) -> None:
        if not follower.dropped:
            self._close(follower)
            log.warning("replication: follower %s (%s) dropped: %s", follower.id, follower.address, reason)
            self._spawn(self._leave_isr(follower))

    def _close(self, follower: _Follower) -> None:
        follower.dropped = True
        follower.streaming = False
        follower.queue.clear()
        follower.queued_bytes = 0
        follower.wake.set()
        if follower.thread_writer is not None:
            follower.thread_writer.abort()  # shuts the socket down: the thread's dup keeps it open otherwise
        if self._followers.get(follower.id) is follower:
            del self._followers[follower.id]
        follower.writer.close()

    async def _watch_acks(self) -> None:
        quiet_end, quiet_since, stamped_at = -1, time.monotonic(), time.monotonic()
        while True:
            await asyncio.sleep(0.25)
            now = time.monotonic()
            if self._followers and self._changed_end > self._epoch_end and now - stamped_at >= EPOCH_INTERVAL:
                self._stamp_epoch()
                stamped_at = now
            if self.epoch > self._recorded_epoch and not self._recording and self._held(self._epoch_end):
                self._recording = True
                self._spawn(self._record_epoch(self.epoch, self._epoch_end))
            if self._log_end != quiet_end:
                quiet_end, quiet_since = self._log_end, now
            elif now - quiet_since >= self.heartbeat_interval:
                self._emit(proto.OP_HEARTBEAT, "")  # a follower that does not answer is dropped below
                quiet_end, quiet_since = self._log_end, now
            for follower in list(self._followers.values()):
                if follower.streaming and follower.sent > follower.acked \
                        and now - follower.last_progress > self.ack_timeout:
                    self._drop_later(follower, f"no acknowledgement for {self.ack_timeout:g} s")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ticket: Ticket) -> None:
        """An admitted connection (ReplicationListener), TLS done; ``ticket`` is its place among the
        unauthenticated ones."""
        sock = writer.get_extra_info("socket")
        if sock is not None:
            proto.tune_socket(sock)
        peer = writer.get_extra_info("peername")
        address = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        decoder = proto.FrameDecoder(max_frame=proto.HANDSHAKE_MAX_FRAME)
        follower: _Follower | None = None
        try:
            try:
                async with asyncio.timeout(self.handshake_timeout):
                    node_id = await self._authenticate(reader, writer, decoder, address)
            finally:
                ticket.release()
            if node_id is None:
                return
            decoder.max_frame = proto.MAX_FRAME  # the file list may be large
            await self._attached.wait()
            old = self._followers.get(node_id)
            if old is not None:
                self._drop_later(old, "the same node connected again")
            follower = _Follower(node_id, address, writer, self._log_end)
            self._followers[node_id] = follower  # registered first: every later change is buffered
            log.info("replication: follower %s (%s) connected; full sync", node_id, address)
            kind, payload = await proto.next_frame(reader, decoder)
            if kind != proto.FILE_LIST:
                raise proto.ProtocolError(f"expected a file list, got frame type {kind}")
            await self._full_sync(follower, proto.parse_file_list(payload))
            follower.join_target = self._log_end
            writer.write(proto.frame(proto.SYNC_END, proto.pack_u64(follower.start)))
            if decoder.pending or decoder.buffered:  # it speaks only to acknowledge the stream
                raise proto.ProtocolError("data from the follower before the end of its full sync")
            # From now on its acknowledgements are read in the transport's callback (no stream task).
            acks = _AckReader(self, follower)
            writer.transport.set_protocol(acks)
            if THREAD_WRITER and self._tls is None and sock is not None:
                follower.thread_fd = sock.fileno()
            follower.streaming = True
            follower.last_progress = time.monotonic()
            follower.wake.set()
            sender = self._spawn(self._send_stream(follower))
            try:
                await acks.closed
            finally:
                sender.cancel()
            if not follower.dropped:
                self._drop_later(follower, "connection closed")
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, proto.ProtocolError, OSError,
                ssl.SSLError) as exc:
            if follower is not None and not follower.dropped:
                self._drop_later(follower, f"{type(exc).__name__}: {exc}")
            elif follower is None:
                log.warning("replication: connection from %s ended: %s", address, exc or type(exc).__name__)
                if isinstance(exc, proto.ProtocolError):
                    writer.transport.abort()  # unread bytes are not waited for
        finally:
            writer.close()

    async def _authenticate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                            decoder: proto.FrameDecoder, address: str) -> str | None:
        kind, payload = await proto.next_frame(reader, decoder, proto.HANDSHAKE_MAX_FRAME)
        if kind != proto.HELLO:
            raise proto.ProtocolError(f"expected hello, got frame type {kind}")
        version, follower_nonce, node_id = proto.parse_hello(payload)
        if version != proto.PROTOCOL_VERSION:
            writer.write(proto.frame(proto.REFUSED, proto.pack_str(f"protocol version {version} unsupported")))
            log.warning("replication: refused %s: protocol version %d", address, version)
            return None
        leader_nonce = proto.new_nonce()
        writer.write(proto.challenge(leader_nonce, proto.leader_proof(self._secret, follower_nonce, leader_nonce)))
        kind, payload = await proto.next_frame(reader, decoder, proto.HANDSHAKE_MAX_FRAME)
        expected = proto.follower_proof(self._secret, follower_nonce, leader_nonce, node_id)
        if kind != proto.AUTH or not proto.proof_matches(expected, payload):
            log.warning("replication: refused follower %r from %s: wrong shared secret", node_id, address)
            writer.write(proto.frame(proto.REFUSED, proto.pack_str("authentication failed")))
            await writer.drain()
            return None
        writer.write(proto.frame(proto.AUTH_OK))
        await writer.drain()
        return node_id

    async def _full_sync(self, follower: _Follower, theirs: dict[str, tuple[int, str]]) -> None:
        loop = asyncio.get_running_loop()
        ours = await loop.run_in_executor(None, _local_sizes, self.data_dir)
        writer = follower.writer
        writer.write(proto.delete_list(sorted(rel for rel in theirs if rel not in ours)))
        for rel, (path, size) in ours.items():
            if follower.dropped:
                raise ConnectionResetError("dropped during full sync")
            mine = theirs.get(rel)
            if mine is not None and mine[0] == size:
                try:
                    if await loop.run_in_executor(None, proto.file_sha1, path) == mine[1]:
                        continue
                except FileNotFoundError:
                    continue  # deleted meanwhile: its deletion is in the stream
            await self._send_file(follower, rel, path)

    async def _send_file(self, follower: _Follower, rel: str, path: Path) -> None:
        loop = asyncio.get_running_loop()
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return  # deleted meanwhile: its deletion is in the stream
        try:
            size = os.fstat(fd).st_size
            writer = follower.writer
            if follower.dropped:  # while its hash was computed
                raise ConnectionResetError("dropped during full sync")
            writer.write(proto.frame(proto.FILE_START, proto.pack_str(rel) + proto.pack_u64(size)))
            offset = 0
            while True:
                chunk = await loop.run_in_executor(None, os.pread, fd, proto.CHUNK_SIZE, offset)
                if follower.dropped:  # its transport is closed: writing to it raises under uvloop
                    raise ConnectionResetError("dropped during full sync")
                if not chunk:
                    break
                offset += len(chunk)
                writer.write(proto.frame(proto.FILE_CHUNK, chunk))
                await writer.drain()  # bounded memory: one chunk in flight at a time
            writer.write(proto.frame(proto.FILE_END))
            follower.sync_bytes += offset
        finally:
            os.close(fd)

    async def _send_stream(self, follower: _Follower) -> None:
        transport = follower.writer.transport
        high_water = transport.get_write_buffer_limits()[1]
        while not follower.dropped:
            if not follower.queue:
                follower.wake.clear()
                await follower.wake.wait()
            elif follower.thread_writer is not None and follower.thread_writer.buffered() > WRITER_HIGH_WATER:
                await asyncio.sleep(WRITER_POLL_SECONDS)  # the thread says nothing when it drains
            elif not follower.writable.is_set() or transport.get_write_buffer_size() > high_water:
                # Above the mark the transport has paused us (maybe before the ack reader took over:
                # its resume comes to the reader all the same).
                follower.writable.clear()
                await follower.writable.wait()
            else:
                self._write_queued(follower)

    def _write_queued(self, follower: _Follower) -> None:
        """Hand up to a chunk of the follower's queued operations to its socket."""
        batch = []
        size = 0
        while follower.queue and size < proto.CHUNK_SIZE:
            encoded = follower.queue.popleft()
            batch.append(encoded)
            size += len(encoded)
        follower.queued_bytes -= size
        if follower.sent == follower.acked:  # the ack clock starts with the first unacknowledged byte
            follower.last_progress = time.monotonic()
        follower.sent += size
        writer = follower.thread_writer
        if writer is None and follower.thread_fd >= 0 and not follower.writer.transport.get_write_buffer_size():
            # Only with the transport's buffer empty: the thread's bytes must come after its.
            writer = follower.thread_writer = csocket.SocketWriter(follower.thread_fd)  # type: ignore[union-attr]
        if writer is None:
            follower.writer.writelines(batch)  # the transport gathers them: no joined copy
            return
        # One write: one by one, the thread sent the index entries in a second send behind the segment
        # bytes, which the follower often read, fsynced and acknowledged as a batch of its own.
        if writer.write(batch[0] if len(batch) == 1 else b"".join(batch)) < 0:
            self._drop_later(follower, "send failed")  # the thread stopped on a send error: it is gone

    @staticmethod
    def _idle_enough(follower: _Follower) -> bool:
        """Whether a flush's operations go to ``follower``'s socket at once (else the sender task
        takes them once the backlog has drained)."""
        if follower.thread_writer is not None:
            return bool(follower.thread_writer.buffered() < WRITER_HIGH_WATER)
        return not follower.writer.transport.get_write_buffer_size()

    def _acknowledged(self, follower: _Follower, frames: list[tuple[int, bytes]]) -> None:
        for kind, payload in frames:
            if kind != proto.ACK:
                raise proto.ProtocolError(f"expected an ack, got frame type {kind}")
            acked = proto.unpack_u64(payload)
            if acked > follower.sent:
                raise proto.ProtocolError(f"ack of {acked} beyond the {follower.sent} bytes sent")
            if acked > follower.acked:
                follower.acked = acked
                follower.last_progress = time.monotonic()
        if not follower.joined:
            self._join_step(follower)
        self._release()


class _AckReader(asyncio.Protocol):
    """A streaming follower's connection: its acknowledgements release confirms in the turn they
    arrive, and its flow control paces the sender."""

    def __init__(self, server: ReplicationServer, follower: _Follower) -> None:
        self._server = server
        self._follower = follower
        self._decoder = proto.FrameDecoder()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        if self._follower.dropped:
            return
        try:
            self._server._acknowledged(self._follower, self._decoder.feed(data))
        except proto.ProtocolError as exc:
            self._server._drop_later(self._follower, f"ProtocolError: {exc}")

    def connection_lost(self, exc: Exception | None) -> None:
        self._follower.writable.set()
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        self._follower.writable.clear()

    def resume_writing(self) -> None:
        self._follower.writable.set()


def _local_sizes(root: Path) -> dict[str, tuple[Path, int]]:
    found = {}
    for rel, path in proto.replicated_files(root):
        try:
            found[rel] = (path, path.stat().st_size)
        except FileNotFoundError:
            continue
    return found
