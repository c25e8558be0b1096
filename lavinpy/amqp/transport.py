"""The asyncio side of a connection: owns the socket and the timers, drives the state machine.

Output is written once per turn of the model (``broker.scheduler``: after the input of a poll of the
loop was read, and after each round of deliveries), as one buffer: uvloop drains a buffer of many tiny
pieces very slowly, and a consumer among thousands gets one send() per turn, not one per other
client's ack. What the input asks of the socket itself (pause, close, timers) is done at once. The
transport's 1 MiB high-water mark makes the connection unwritable (no deliveries, no reading) until the
buffer drains.

With the compiled codec, a busy plain TCP connection's output (past WRITER_AFTER_BYTES) goes through
``_csocket.SocketWriter``: a thread that never takes the GIL does the send() system calls on the other
core (quiet connections, such as most publishers', keep no thread and no buffer); a small write that
finds the thread idle is sent at once by the loop (at low rates waking the thread cost more). Its backlog is
checked against the same high-water mark (polled while above it, since the thread cannot call
back into the loop), and a close waits for it to drain.

Likewise the input of a connection whose input streams (READER_AFTER_BYTES within READER_WINDOW)
moves to ``_csocket.SocketReader``: a thread without the GIL does the recv() calls into a backlog of at
most READER_BACKLOG bytes and wakes the loop through an eventfd once per batch (a small piece of a
stream waits up to READER_HOLD_US for more, so the loop's per-read work is paid once for several, and
a stream that goes on is then taken once per READER_HOLD_US; one after output to the client is not
held); the loop takes the backlog in turns of READER_TAKE_BYTES.
The transport's own reading stays paused from then on, and the connection's pause/resume effects
pause and resume the thread instead (a paused thread stops receiving, so the client's TCP window
closes as it would with the transport paused). TLS connections keep the plain asyncio path.
``LAVINPY_SOCKET_THREADS`` (lavinpy.wire.accel) selects which of the two threads busy connections get.

``LoopScheduling`` is the session layer's scheduling on the running event loop.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from ..broker.ops import peer_certificate
from ..wire.accel import SOCKET_THREADS, csocket
from ..wire.constants import PROTOCOL_HEADER
from ..wire.proxy_header import ProxyHeader, may_be_proxy_header
from .connection import AMQPConnection
from .effects import CancelTimer, Effect, SetTimer, TimerKind
from .log import log_bad_proxy_header

if TYPE_CHECKING:
    from .sessions import Sessions

# 1 MiB, not more: a consumer's backlog of that size is still tens of ms of sending, and each MiB
# of it is RSS (4 MiB each way cost a busy broker 5 MiB of its peak with no gain in throughput).
WRITE_HIGH_WATER = 1024 * 1024
WRITER_LOW_WATER = WRITE_HIGH_WATER // 4  # a paused connection resumes below this
WRITER_POLL_SECONDS = 0.002  # how often a paused connection looks at its writer thread's backlog
WRITER_AFTER_BYTES = 1024 * 1024  # output of a connection before it gets a writer thread
READER_AFTER_BYTES = 1024 * 1024  # input within READER_WINDOW seconds before a connection gets a reader thread
READER_WINDOW = 1.0
# Received and not yet taken by the loop: the thread stops receiving here. Two takes' worth: with 1 MiB a
# publisher outrunning the loop (scenario a) kept 1-2 MiB more resident in the thread's buffer.
READER_BACKLOG = 512 * 1024
READER_TAKE_BYTES = 256 * 1024  # taken per wake-up, so one client's backlog cannot hold the loop
# A small input that follows another closely, with no output between them (a stream, not requests
# waiting for answers), waits up to this many µs for more before the thread wakes the loop: one
# wake-up (and one pass of the per-read Python work) for several pieces of a stream. While the stream
# goes on the thread then paces it: it sleeps this long and takes what came meanwhile, one wake-up of
# the thread and of the loop per period whatever the number of the client's writes. 1000 µs with the
# pacing: at a fixed 40k msg/s about a quarter less broker CPU per message than 500 µs without it, for
# about 0.3 ms more median latency (LavinMQ's median there is 0.2-16 ms under load); a publisher
# waiting for confirms is never held or paced.
READER_HOLD_US = int(os.environ.get("LAVINPY_READER_HOLD_US", "1000"))
WRITER_ENABLED = csocket is not None and "writer" in SOCKET_THREADS
READER_ENABLED = csocket is not None and "reader" in SOCKET_THREADS and hasattr(csocket, "SocketReader")


class LoopScheduling:
    """``sessions.Scheduling`` on the event loop running at the time of each call (the server's object
    is made before its loop runs)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task] = set()  # the loop keeps only weak references to its tasks

    def start_task(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def call_later(self, delay: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(delay, callback)


class AMQPProtocol(asyncio.Protocol):
    def __init__(self, sessions: Sessions, forwarded: ProxyHeader | None = None) -> None:
        """``forwarded``: the PROXY header a trusted proxy sent (the listener read it); its client is the
        connection's peer for listings, the loopback-only rule and the login throttle."""
        self.sessions = sessions
        self.forwarded = forwarded
        # (client, local) addresses as the connection listing reads them (None: the socket's own).
        self.proxied: tuple[tuple[str, int], tuple[str, int] | None] | None = (
            (forwarded.source, forwarded.destination) if forwarded is not None and forwarded.source else None)
        self._first_read = True  # a PROXY header in the first bytes now is bad input
        self.conn: AMQPConnection | None = None
        self.transport: asyncio.Transport | None = None
        self._timers: dict[TimerKind, asyncio.TimerHandle] = {}
        self._loop = asyncio.get_event_loop()
        self._writer: Any = None  # the SocketWriter, when the output goes through a writer thread
        self._written = 0  # bytes written through the transport, until a writer thread takes over
        self._writer_fd = -1  # the socket a writer thread may use (plain TCP with the compiled codec)
        self._reader: Any = None  # the SocketReader, when the input comes from a reader thread
        self._read = 0  # bytes received through the transport in the current window
        self._read_window_end = 0.0
        self._reader_fd = -1  # the socket a reader thread may use
        self._reader_watched = False  # the loop watches the reader thread's wake-up fd
        self._reading_paused = False  # as the connection last asked (PAUSE_READING / RESUME_READING)
        # Output waiting for the write buffer to drain below its high-water mark (large body slices).
        self._held: list[bytes | memoryview] | None = None

    # --- asyncio.Protocol ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)  # type: ignore[attr-defined]
        sock = transport.get_extra_info("socket")
        if sock is not None and transport.get_extra_info("sslcontext") is None:
            if WRITER_ENABLED:
                self._writer_fd = sock.fileno()
            if READER_ENABLED:
                self._reader_fd = sock.fileno()
        peer = transport.get_extra_info("peername")
        conn = self.conn = AMQPConnection(self.sessions, peer if isinstance(peer, tuple) else None)
        if self.proxied is not None:
            client = self.proxied[0]
            conn.peer_host = client[0]
            conn.name = f"{client[0]}:{client[1]}"
        conn.peer_certificate = peer_certificate(transport.get_extra_info("ssl_object"))
        conn.driver = self
        conn.start()
        self.pump()

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        assert conn is not None
        if self._first_read:
            self._first_read = False
            if may_be_proxy_header(data[:16]):
                # Not from a trusted source (the listener took a trusted one's header): refused, so
                # that nobody can claim another address. Answered as any bad protocol header is.
                transport = self.transport
                if transport is not None:
                    what = "AMQPS" if transport.get_extra_info("sslcontext") else "AMQP"
                    log_bad_proxy_header(what, transport.get_extra_info("peername"),
                                         "a PROXY header from a source not in proxy_protocol_trusted_sources")
                    transport.write(PROTOCOL_HEADER)
                    transport.close()
                return
        conn.receive_data(data)
        if conn.effects_waiting():
            self.pump()  # what the input asked of the socket (pause, close, timers) now, after its output
        if self._reader_fd >= 0:
            # Only a connection whose input streams gets a thread: one that asks and waits for the
            # answer would pay the hand-over's latency on every request and gain nothing.
            now = time.monotonic()
            if now > self._read_window_end:
                self._read, self._read_window_end = 0, now + READER_WINDOW
            self._read += len(data)
            if self._read > READER_AFTER_BYTES and not self._reading_paused:
                self._start_reader()

    def _start_reader(self) -> None:
        """Hand the socket's input to a reader thread; the transport reads no more."""
        transport = self.transport
        self._reader_fd, fd = -1, self._reader_fd
        if transport is None or transport.is_closing():
            return
        transport.pause_reading()
        self._reader = csocket.SocketReader(fd, READER_BACKLOG, READER_HOLD_US)  # type: ignore[union-attr]
        self._loop.add_reader(self._reader.wake_fd, self._take_input)
        self._reader_watched = True

    def _take_input(self) -> None:
        """The reader thread's wake-up: feed what it received to the connection, in turns."""
        reader, conn, transport = self._reader, self.conn, self.transport
        if reader is None or conn is None or transport is None:
            return
        if self._reading_paused:
            # Paused only for the other clients' turn, the wake-up fd stays watched (see
            # _set_reading_paused): nothing is taken until the turn ends. Paused for more since then
            # (its output backed up, an alarm), the loop stops watching now.
            if not conn.input_yielded():
                self._stop_watching(reader)
            return
        data, end = reader.take(READER_TAKE_BYTES)
        self.sessions.input_waiting = reader.buffered > 0
        if data:
            conn.receive_data(data)
            if conn.effects_waiting():
                self.pump()
        if end and self._reader is reader:  # the backlog is empty and the socket's input ended
            self._stop_reader()
            if end > 0:  # EOF: closed as asyncio closes a transport whose protocol ignores the EOF
                transport.close()
            else:  # a receive error (a reset)
                transport.abort()

    def _stop_reader(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            self.sessions.input_waiting = False  # (it may have been this reader's)
            if self._reader_watched:
                self._reader_watched = False
                self._loop.remove_reader(reader.wake_fd)
            reader.stop()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_reader()
        self._held = None
        if self._writer is not None and not self._writer.finishing:
            self._writer.abort()  # the peer is gone: nothing more can be sent
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        conn, self.conn = self.conn, None
        if conn is not None:
            if conn.input_left():
                conn.set_writable(False)  # nothing more can be sent: no deliveries meanwhile
            self._end_input(conn)
        self.transport = None

    def _end_input(self, conn: AMQPConnection) -> None:
        """Input read before the socket went is applied in turns, the other clients' between them, as
        if the socket were still there; then the connection is told it is lost."""
        if conn.input_left():
            conn.timer_fired(TimerKind.INPUT_TURN)  # (its timer went with the socket's)
            if conn.input_left():
                self._loop.call_soon(self._end_input, conn)
                return
        conn.lost()
        # The connection and this driver refer to each other: without these references the pair
        # (and the transport) is freed at once, not left for a full collection of the garbage
        # collector (whose cost grows with everything else alive; see server.GC_THRESHOLDS).
        conn.driver = None

    def pause_writing(self) -> None:
        if self.conn is not None:
            self.conn.set_writable(False)
            self.pump()

    def resume_writing(self) -> None:
        if self.conn is not None:
            if not self._send_held():  # back above the high-water mark: pause_writing comes again
                return
            self.conn.set_writable(True)
            self.pump()

    # --- ConnectionDriver -----------------------------------------------------------------------
    def pump(self) -> None:
        """Write the connection's queued output as one buffer, then carry out its effects."""
        conn = self.conn
        transport = self.transport
        if conn is None or transport is None:
            return
        out = conn.data_to_send()
        if out and not transport.is_closing():
            if self._reader is not None:
                self._reader.answered()  # the client may be waiting for this: its next input is not held
            if self._held is not None:
                self._held += out  # behind the slices that wait for the buffer to drain
            elif len(out) == 1:
                self._send(out[0], transport)
            elif memoryview not in map(type, out):
                self._send(b"".join(out), transport)
            else:
                self._send_pieces(out, transport)
        for effect in conn.take_effects():
            self._apply(effect, transport)

    def _send(self, data: bytes | memoryview, transport: asyncio.Transport) -> int:
        """Hand ``data`` to the transport or the writer thread; returns the bytes queued and unsent
        (-1: the writer thread stopped, the connection is aborted)."""
        conn = self.conn
        assert conn is not None
        if self._writer is None:
            transport.write(data)
            if self._writer_fd >= 0:
                self._written += len(data)
                # Only with the transport's buffer empty: the thread's bytes must come after its.
                if self._written > WRITER_AFTER_BYTES and not transport.get_write_buffer_size():
                    self._writer = csocket.SocketWriter(self._writer_fd)  # type: ignore[union-attr]
            return transport.get_write_buffer_size()
        if type(data) is memoryview and type(data.obj) is mmap.mmap:
            # a body read in place from a segment: its pages leave the RSS once the thread has them
            queued: int = self._writer.write_mapped(data)
        else:
            queued = self._writer.write(data)
        if queued < 0:  # the writer thread stopped on a send error: the peer is gone
            transport.abort()
        elif queued > WRITE_HIGH_WATER and conn.writable:
            conn.set_writable(False)
            self._loop.call_later(WRITER_POLL_SECONDS, self._poll_writer)
        return queued

    def _send_pieces(self, pieces: list[bytes | memoryview], transport: asyncio.Transport) -> None:
        """Output holding large bodies as memoryview slices (of the spool or the message's bytes):
        each slice is handed over as it is, the small pieces between them joined. Once the queued
        bytes pass the high-water mark the rest waits in ``_held`` (it costs no copy: the slices keep
        the body alive) until the buffer drains, so a large body is never buffered whole twice."""
        self._held = []  # output made meanwhile (a re-entrant pump) goes behind these pieces
        start = 0
        queued = 0
        count = len(pieces)
        for i in range(count):
            piece = pieces[i]
            if type(piece) is not memoryview:
                continue
            if queued > WRITE_HIGH_WATER:
                break
            if i > start:
                self._send(pieces[start] if i - start == 1 else b"".join(pieces[start:i]), transport)
            queued = self._send(piece, transport)
            start = i + 1
            if queued < 0:
                self._held = None
                return
        else:
            if start < count:
                queued = self._send(b"".join(pieces[start:]), transport)
            start = count
        rest = pieces[start:] + (self._held or [])
        self._held = None
        if not rest:
            return
        if queued <= WRITE_HIGH_WATER:  # only output made meanwhile is left: it goes the usual way
            if memoryview in map(type, rest):
                self._send_pieces(rest, transport)
            else:
                self._send(b"".join(rest), transport)
            return
        self._held = rest
        conn = self.conn
        if self._writer is not None and conn is not None and conn.writable:
            conn.set_writable(False)
            self._loop.call_later(WRITER_POLL_SECONDS, self._poll_writer)

    def _send_held(self) -> bool:
        """Send what waits in ``_held``; True when nothing waits any more."""
        held, self._held = self._held, None
        transport = self.transport
        if held and transport is not None and not transport.is_closing():
            self._send_pieces(held, transport)
        return self._held is None

    def _apply(self, effect: Effect | SetTimer | CancelTimer, transport: asyncio.Transport) -> None:
        if type(effect) is SetTimer:
            old = self._timers.pop(effect.kind, None)
            if old is not None:
                old.cancel()
            if not transport.is_closing():
                self._timers[effect.kind] = self._loop.call_later(effect.delay, self._fire, effect.kind)
        elif type(effect) is CancelTimer:
            old = self._timers.pop(effect.kind, None)
            if old is not None:
                old.cancel()
        elif transport.is_closing():
            return
        elif effect is Effect.CLOSE:
            self._stop_reader()  # as a closing transport reads no more
            held, self._held = self._held, None
            for piece in held or ():  # closing: what waits goes out before the end, whatever its size
                self._send(piece, transport)
            if self._writer is not None:
                self._writer.finish()  # sends what is queued, then closes its side of the socket
            transport.close()
        elif effect is Effect.PAUSE_READING:
            self._set_reading_paused(True, transport)
        elif effect is Effect.RESUME_READING:
            self._set_reading_paused(False, transport)

    def _set_reading_paused(self, paused: bool, transport: asyncio.Transport) -> None:
        was_paused, self._reading_paused = self._reading_paused, paused
        reader = self._reader
        if reader is None:
            if paused:
                transport.pause_reading()
            else:
                transport.resume_reading()
        elif paused != was_paused:
            if paused:
                if self.conn is not None and self.conn.input_yielded():
                    # Paused only for the other clients' turn: it resumes in the next turn of the loop,
                    # and its input still waits. The thread goes on receiving into its bounded backlog
                    # and the loop keeps watching (_take_input takes nothing meanwhile): a busy
                    # publisher yields every READER_TAKE_BYTES or so, and unwatching and watching again
                    # (two epoll_ctl calls, a uvloop handle, the thread's pause and resume) cost about
                    # 8 % of the loop's CPU at 64 KiB bodies.
                    return
                self._stop_watching(reader)
            elif not self._reader_watched:
                self._reader_watched = True
                reader.set_paused(False)
                self._loop.add_reader(reader.wake_fd, self._take_input)

    def _stop_watching(self, reader: Any) -> None:
        """Stop the reader thread and the loop's watch of it (reading paused for more than a turn)."""
        # Not taken before it resumes: no output waits for it.
        self.sessions.input_waiting = False
        if self._reader_watched:
            # The loop stops watching too: the wake-up fd stays readable while a backlog waits.
            self._reader_watched = False
            reader.set_paused(True)
            self._loop.remove_reader(reader.wake_fd)

    def _poll_writer(self) -> None:
        """While paused by the writer thread's backlog: resume once it is below the low-water mark."""
        conn, writer = self.conn, self._writer
        if conn is None or writer is None or conn.writable or self.transport is None or self.transport.is_closing():
            return
        queued = writer.buffered()
        if queued < 0:
            self.transport.abort()
        elif queued < WRITER_LOW_WATER:
            if not self._send_held():  # more slices wait: back above the high-water mark
                self._loop.call_later(WRITER_POLL_SECONDS, self._poll_writer)
                return
            conn.set_writable(True)
            self.pump()
        else:
            self._loop.call_later(WRITER_POLL_SECONDS, self._poll_writer)

    def _fire(self, kind: TimerKind) -> None:
        self._timers.pop(kind, None)
        if self.conn is not None:
            self.conn.timer_fired(kind)
            self.pump()
