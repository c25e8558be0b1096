"""The blocking adapter of ClientConnection: one thread, one socket (the Spark data source's tasks).

The handshake and the connection's close run through the sans-IO ClientConnection; after it the
connection hands raw frames to its user (the Spark publisher and stream reader pack and parse the
hot frames with lavinpy.wire.client), since a single-threaded task wants raw throughput: a
general client's per-message overhead (~20-30 us) caps a task near 40k messages/s.

The socket is non-blocking and every wait goes through select(), so a large send never blocks
while the broker is itself waiting for us to read (acks, deliveries): incoming bytes are buffered
during sends.
"""

from __future__ import annotations

import platform
import select
import socket
import ssl
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Self

from pamqp import commands
from pamqp.base import Frame as MethodFrame

from lavinpy.wire.accel import cclient
from lavinpy.wire.buffers import drop_front
from lavinpy.wire.client import FRAME_HEAD, WireError, decode_method, frame, method_id, split_frames
from lavinpy.wire.client_closing import closing as _closing
from lavinpy.wire.client_connection import ClientConnection, ClientProtocolError
from lavinpy.wire.client_events import ConnectionClosed, ConnectionOpened
from lavinpy.wire.client_heartbeat import Heartbeats
from lavinpy.wire.constants import FRAME_END, FRAME_HEARTBEAT, FRAME_METHOD
from lavinpy.wire.uri import TLSOptions, Tuning, parse_url
from lavinpy.wire.writer import method_frame

__all__ = ["AMQPClientError", "AMQPParams", "BlockingConnection", "BrokerClosed", "ConnectionLost", "Frame"]

DEFAULT_PORT = 5672
_RECV_SIZE = 1 << 20
_CLOSE = commands.Connection.Close.index
_CLOSE_OK = commands.Connection.CloseOk.index
_CHANNEL_CLOSE = commands.Channel.Close.index
_CHANNEL_CLOSE_OK = commands.Channel.CloseOk.index
_CONSUMER_REPLIES = (commands.Channel.OpenOk.index, commands.Basic.QosOk.index, commands.Basic.ConsumeOk.index)


class AMQPClientError(Exception):
    """Base of the errors raised by the blocking AMQP client."""


class ConnectionLost(AMQPClientError):
    """The socket closed or timed out."""


class BrokerClosed(AMQPClientError):
    """The broker closed the channel or the connection (channel.close / connection.close)."""

    def __init__(self, scope: str, reply_code: int, reply_text: str, class_id: int = 0,
                 method_id: int = 0) -> None:
        self.scope = scope
        self.reply_code = reply_code
        self.reply_text = reply_text
        self.class_id = class_id
        self.method_id = method_id
        super().__init__(f"broker closed the {scope}: {reply_code} {reply_text}")


@dataclass(frozen=True)
class AMQPParams:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    username: str = "guest"
    password: str = "guest"
    vhost: str = "/"
    timeout: float = 30.0
    tls: TLSOptions | None = None  # amqps://
    tuning: Tuning = Tuning()  # the URL's heartbeat, connection_timeout, channel_max, frame_max, auth_mechanism

    @classmethod
    def from_url(cls, url: str, timeout: float = 30.0) -> AMQPParams:
        """amqp[s]://user:pass@host:port/vhost (vhost percent-encoded, e.g. %2f; empty path -> '/').

        Takes RabbitMQ's URI query keys (lavinpy.wire.uri): TLS ones for amqps://, and the connection's.
        """
        u = parse_url(url)
        return cls(host=u.host, port=u.port, username=u.user, password=u.password, vhost=u.vhost,
                   timeout=timeout, tls=u.tls, tuning=u.tuning)

    def safe_url(self) -> str:
        """The URL without the password, for error messages."""
        scheme = "amqps" if self.tls is not None else "amqp"
        return f"{scheme}://{self.username}@{self.host}:{self.port}/{self.vhost}"


Frame = tuple[int, int, bytes]  # (frame type, channel, payload)


class BlockingConnection:
    """One AMQP connection. Frames are exchanged raw; control methods go through pamqp."""

    def __init__(self, params: AMQPParams, product: str = "lavinpy") -> None:
        self.params = params
        self.product = product
        self.client: ClientConnection | None = None
        self.sock: socket.socket | None = None
        self.frame_max = 131072
        self.server_properties: dict[str, Any] = {}
        self._rbuf = bytearray()
        self._backlog: deque[Frame] = deque()
        self._next_channel = 1
        self._closing_channels: set[int] = set()
        self._closed_soon = False  # close_soon sent connection.close: the closing list owns the socket
        # For the heartbeat thread: held while writing (and reading TLS, which is not thread-safe).
        self.io_lock, self.verdict = threading.RLock(), ""
        self._heartbeats: Heartbeats | None = None

    # --- lifecycle --------------------------------------------------------------------------------
    def open(self) -> Self:
        _closing.reap()
        p = self.params
        try:
            sock = socket.create_connection((p.host, p.port), timeout=p.tuning.connection_timeout or p.timeout)
        except OSError as exc:
            raise ConnectionLost(f"cannot connect to {p.safe_url()}: {exc}") from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if p.tls is not None:
            try:  # the handshake runs while the socket still blocks (with the timeout)
                sock = p.tls.context().wrap_socket(sock, server_hostname=p.tls.server_name or p.host)
            except (OSError, ValueError) as exc:
                sock.close()
                raise ConnectionLost(f"TLS to {p.safe_url()} failed: {exc}") from exc
        sock.setblocking(False)
        self.sock = sock
        try:
            self._handshake()
        except BaseException:
            self.abort()
            raise
        return self

    def _handshake(self) -> None:
        p = self.params
        client = self.client = ClientConnection(
            p.username, p.password, p.vhost, product=self.product,
            # Heartbeats off unless the URL asks: a task's connection is never idle long, and the
            # driver's connections reconnect on failure (the Spark source's streams.py).
            heartbeat=p.tuning.heartbeat or 0, mechanisms=p.tuning.mechanisms,
            frame_max=p.tuning.frame_max, channel_max=p.tuning.channel_max,
            capabilities={"publisher_confirms": True, "consumer_cancel_notify": True, "basic.nack": True,
                          "connection.blocked": True, "authentication_failure_close": True})
        client.client_properties["platform"] = f"Python {platform.python_version()}"
        client.initiate()
        deadline = time.monotonic() + (p.tuning.connection_timeout or p.timeout)
        while True:
            out = client.data_to_send()
            if out:
                self.send(out)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ConnectionLost(f"timed out in the AMQP handshake with {p.safe_url()}")
            readable, _, _ = select.select([self._socket()], [], [], remaining)
            if not readable:
                continue
            self._recv_raw()
            try:
                events = client.receive_data(self._rbuf)
            except ClientProtocolError as exc:
                out = client.data_to_send()  # the connection.close that tells the broker why
                if out:
                    self.send(out)
                raise AMQPClientError(f"{p.safe_url()}: {exc}") from None
            self._rbuf.clear()
            for event in events:
                if isinstance(event, ConnectionOpened):
                    self.frame_max = event.frame_max
                    self.server_properties = dict(event.server_properties)
                    self._heartbeats = Heartbeats(self, client.heartbeat_interval) if event.heartbeat else None
                    return
                if isinstance(event, ConnectionClosed):
                    self.send(client.data_to_send())  # close-ok
                    raise BrokerClosed("connection", event.reply_code, event.reply_text, event.class_id,
                                       event.method_id)

    def close(self) -> None:
        """Close politely if possible; never raises. After close_soon, nothing to do."""
        if self.sock is None or self._closed_soon:
            return
        try:
            self._stop_heartbeats()
            if self.client is not None:
                self.client.close(200, "bye")
                self.send(self.client.data_to_send())
            deadline = time.monotonic() + 2.0
            done = False
            while not done and time.monotonic() < deadline:
                done = _has_close_ok(self.read_frames(deadline - time.monotonic()))
        except Exception:  # closing is best effort: the socket is dropped either way
            pass
        finally:
            self.abort()

    def close_soon(self, first: bytes = b"") -> None:
        """Send ``first`` (acks, cancels) and connection.close in one write, and return without waiting
        for the close-ok: the broker applies what came before the close, in order, then closes its end.
        The connection is left to the module's closing list, which closes the socket once the close-ok
        (or the end of the stream) has been read: a socket closed with a reply unread resets the
        connection, and a reset can drop bytes still on their way to the broker. Never raises; a
        failed send drops the connection."""
        if self.sock is None or self._closed_soon:
            return
        self._closed_soon = True
        self._stop_heartbeats()
        try:
            if self.client is None:
                raise ConnectionLost("no AMQP session to close")
            self.client.close(200, "bye")
            self.send(first + self.client.data_to_send())
        except Exception:  # dropped: the broker requeues what the acks did not reach
            self.abort()
            return
        _closing.hand_over(self)

    def close_ok_came(self) -> bool:
        """For close_soon's list: read what has come, without waiting; True once the close-ok came or
        the connection is gone (the socket is then closed), False while it is still on its way."""
        try:
            while True:
                try:
                    frames = self.read_frames(0)
                except BrokerClosed as exc:  # a channel the broker closed (answered): read on
                    if exc.scope == "connection":
                        break
                    continue
                if not frames:
                    return False
                if _has_close_ok(frames):
                    break
        except Exception:  # lost or malformed: gone either way
            pass
        self.abort()
        return True

    def abort(self) -> None:
        self._stop_heartbeats()
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None

    def _stop_heartbeats(self) -> None:
        """Before connection.close goes out (nothing but close-ok may follow it) and at the end."""
        if self._heartbeats is not None:
            self._heartbeats.stop()
            self._heartbeats = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- channels ---------------------------------------------------------------------------------
    def open_channel(self) -> int:
        ch = self.next_channel()
        self.call(ch, commands.Channel.Open(), commands.Channel.OpenOk)
        return ch

    def open_consumer(self, prefetch: int, consume: bytes) -> int:
        """A new channel consuming: channel.open, basic.qos and ``consume`` (a basic.consume payload)
        go out in one write, one round trip instead of three; their replies come in order, before the
        deliveries, which stay unparsed in rbuf for a reader that scans a buffer at a time. Returns the
        channel; a refusal raises BrokerClosed."""
        ch = self.next_channel()
        self.send(method_frame(ch, commands.Channel.Open())
                  + method_frame(ch, commands.Basic.Qos(prefetch_count=prefetch))
                  + frame(FRAME_METHOD, ch, consume))
        for reply in _CONSUMER_REPLIES:
            self.wait_method_id_first(ch, reply)
        self.unread_backlog()
        return ch

    def next_channel(self) -> int:
        """A channel number for a channel.open the caller sends itself (pipelined with its first methods)."""
        ch = self._next_channel
        self._next_channel += 1
        return ch

    @property
    def channels_left(self) -> int:
        """Channel numbers not handed out yet, within the channel_max agreed with the broker."""
        limit = self.client.channel_max if self.client is not None else 0
        return max(0, limit - self._next_channel + 1)

    def close_channels(self, chs: list[int], first: bytes = b"") -> None:
        """Close several channels at once: ``first`` (frames to send before, such as cancels and acks)
        and a channel.close each go out in one write; returns when every close-ok came, so the broker
        has handled what was sent before it. Deliveries still in flight on them are dropped."""
        closing = set(chs)
        self._closing_channels |= closing
        try:
            close = commands.Channel.Close(reply_code=200, reply_text="done", class_id=0, method_id=0)
            self.send(first + b"".join(method_frame(ch, close) for ch in chs))
            for ch in chs:
                self._wait_method(ch, commands.Channel.CloseOk)
        finally:
            self._closing_channels -= closing
            self._backlog = deque(f for f in self._backlog if f[1] not in closing)

    def close_channel(self, ch: int) -> None:
        """Close a channel, dropping deliveries still in flight on it."""
        self.close_channels([ch])

    def call(self, ch: int, method: Any, reply: type | tuple[type, ...]) -> Any:
        """Send a synchronous method and wait for its reply; other frames are kept for later."""
        self.send_method(ch, method)
        return self._wait_method(ch, reply)

    # --- sending ----------------------------------------------------------------------------------
    def send_method(self, ch: int, method: Any) -> None:
        self.send(method_frame(ch, method))

    def send(self, data: bytes | bytearray | memoryview) -> None:
        """Send everything, reading (and buffering) whatever arrives meanwhile."""
        sock = self._socket()
        view = memoryview(data)
        timeout = self.params.timeout
        with self.io_lock:
            if self.client is not None:
                self.client.note_sent()
            while view:
                try:
                    sent = sock.send(view)
                    view = view[sent:]
                    continue
                except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                    pass
                except OSError as exc:
                    raise ConnectionLost(f"connection to {self.params.safe_url()} lost while sending: "
                                         f"{self.verdict or exc}") from exc
                readable, writable, _ = select.select([sock], [sock], [], timeout)
                if not readable and not writable:
                    raise ConnectionLost(f"timed out after {timeout:.0f}s sending to {self.params.safe_url()}")
                if readable:
                    self._recv()

    # --- receiving --------------------------------------------------------------------------------
    def _socket(self) -> socket.socket:
        if self.sock is None:
            raise ConnectionLost(f"connection to {self.params.safe_url()} is closed")
        return self.sock

    def _recv(self) -> None:
        self._recv_raw(parse_on_close=True)

    def _recv_raw(self, parse_on_close: bool = False) -> None:
        sock = self._socket()
        if self.client is not None:  # called once the socket is readable
            self.client.note_peer_alive()
        if cclient is not None and not isinstance(sock, ssl.SSLSocket):
            # Straight into rbuf's tail: no bytes object a read, no second copy of every byte.
            try:
                got = cclient.recv_append(sock.fileno(), self._rbuf, _RECV_SIZE)
            except OSError as exc:
                self.abort()
                raise ConnectionLost(f"connection to {self.params.safe_url()} lost: {exc}") from exc
            if got:  # bytes came (> 0), or none are there now (-1)
                return
            chunk: bytes | None = b""
        else:
            chunk = self._recv_chunk(sock)
            if chunk is None:
                return
        if not chunk:
            self.abort()
            if parse_on_close:
                self._parse()  # a connection.close sent just before the socket closed says why (BrokerClosed)
            raise ConnectionLost(f"connection to {self.params.safe_url()} {self.verdict or 'closed by the broker'}")
        self._rbuf += chunk

    def _recv_chunk(self, sock: socket.socket) -> bytes | None:
        """What the socket holds now (b"": closed), or None when nothing is there."""
        try:
            with self.io_lock:
                chunk = sock.recv(_RECV_SIZE)
                # Decrypted bytes OpenSSL holds are invisible to select(): take them now.
                while chunk and isinstance(sock, ssl.SSLSocket) and sock.pending():
                    chunk += sock.recv(_RECV_SIZE)
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return None
        except OSError as exc:
            self.abort()
            raise ConnectionLost(f"connection to {self.params.safe_url()} lost: {exc}") from exc
        return chunk

    @property
    def rbuf(self) -> bytearray:
        """Received bytes not parsed yet, for consumers with their own fast parser (streams.py).

        Such a parser may consume complete frames from the front (buffers.drop_front) as long as
        has_backlog is False; anything else is left to read_frames().
        """
        return self._rbuf

    @property
    def has_backlog(self) -> bool:
        return bool(self._backlog)

    def unread_backlog(self) -> None:
        """Put the frames kept in the backlog back in front of rbuf, as bytes: a reader that scans
        rbuf a buffer at a time (the Spark source) then takes them that way too. A consumer's
        deliveries that came in the same read as its consume-ok are otherwise parsed one by one."""
        backlog = self._backlog
        if backlog:
            self._rbuf[:0] = b"".join([frame(ftype, ch, payload) for ftype, ch, payload in backlog])
            backlog.clear()

    def wait_readable(self, timeout: float) -> bool:
        """Wait up to timeout seconds for bytes and append them to rbuf; False if none came."""
        readable, _, _ = select.select([self._socket()], [], [], max(timeout, 0.0))
        if readable:
            before = len(self._rbuf)
            self._recv()
            return len(self._rbuf) > before
        return False

    def read_frames(self, timeout: float | None) -> list[Frame]:
        """Frames available now, waiting up to timeout seconds for at least one (None: forever).

        Returns [] on timeout. connection.close and channel.close from the broker raise BrokerClosed
        after answering them.
        """
        if self._backlog:
            frames = list(self._backlog)
            self._backlog.clear()
            return frames
        frames = self._parse()
        if frames:
            return frames
        sock = self._socket()
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        while True:
            wait = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            readable, _, _ = select.select([sock], [], [], wait)
            if readable:
                self._recv()
                frames = self._parse()
                if frames:
                    return frames
            elif deadline is not None and time.monotonic() >= deadline:
                return []

    def _parse(self) -> list[Frame]:
        """Complete frames in rbuf (split by lavinpy.wire.client.split_frames), heartbeats dropped.

        A connection.close or channel.close consumes only the bytes up to and including it (frames
        after it stay in rbuf), keeps the frames before it in the backlog and raises BrokerClosed.
        """
        buf = self._rbuf
        try:
            parsed, used = split_frames(buf)
        except WireError as exc:
            self.abort()
            raise ConnectionLost(f"malformed frame from {self.params.safe_url()}: {exc}") from exc
        if not used:
            return []
        frames: list[Frame] = []
        closing = self._closing_channels
        for item in parsed:
            ftype, ch, payload = item
            if ftype == FRAME_HEARTBEAT:
                continue
            if ftype == FRAME_METHOD:
                mid = method_id(payload)
                if mid in (_CLOSE, _CHANNEL_CLOSE):
                    # consume what was parsed first, so the error is raised exactly once
                    after = parsed[parsed.index(item) + 1:]  # an equal frame earlier would have raised
                    del buf[:used - sum(8 + len(rest[2]) for rest in after)]
                    self._backlog.extend(frames)
                    if mid == _CLOSE:
                        self._broker_closed_connection(payload)
                    self._broker_closed_channel(ch, payload)
                if ch in closing and mid != _CHANNEL_CLOSE_OK:
                    continue
            elif ch in closing:
                continue
            frames.append(item)
        drop_front(buf, used)
        return frames

    def _broker_closed_connection(self, payload: bytes) -> None:
        method = decode_method(payload)
        try:
            self.send_method(0, commands.Connection.CloseOk())
        except AMQPClientError:
            pass
        self.abort()
        raise BrokerClosed("connection", method.reply_code, method.reply_text, method.class_id, method.method_id)

    def _broker_closed_channel(self, ch: int, payload: bytes) -> None:
        method = decode_method(payload)
        self.send_method(ch, commands.Channel.CloseOk())
        self._backlog = deque(f for f in self._backlog if f[1] != ch)
        raise BrokerClosed(f"channel {ch}", method.reply_code, method.reply_text, method.class_id, method.method_id)

    def _wait_method(self, ch: int, reply: type[MethodFrame] | tuple[type[MethodFrame], ...]) -> Any:
        types = reply if isinstance(reply, tuple) else (reply,)
        ids = {t.index for t in types}
        payload = self._wait_for(ch, ids, " or ".join(t.__name__ for t in types))
        return decode_method(payload)

    def wait_method_id(self, ch: int, mid: int) -> bytes:
        """Wait for a method by its (class << 16 | method) id; returns its raw payload."""
        return self._wait_for(ch, {mid}, f"method {mid >> 16}.{mid & 0xFFFF}")

    def wait_method_id_first(self, ch: int, mid: int) -> bytes:
        """wait_method_id for a reply due before anything else on the connection (a consumer's
        consume-ok on its own connection): that frame alone is parsed, and the deliveries that follow
        it in the same read stay raw in rbuf, for a reader that scans a buffer at a time (parsing
        them into frames here would cost a tuple a frame, and their bytes again to put them back).
        Anything else at the front goes the general way (wait_method_id)."""
        buf = self._rbuf
        deadline = time.monotonic() + self.params.timeout
        while not self._backlog:
            while len(buf) >= 8 and buf[0] == FRAME_HEARTBEAT and buf[1:7] == b"\0\0\0\0\0\0" and buf[7] == FRAME_END:
                drop_front(buf, 8)  # a heartbeat
            if len(buf) >= 11:
                ftype, fch, size = FRAME_HEAD.unpack_from(buf)
                if ftype != FRAME_METHOD or fch != ch or size < 4 or method_id(buf[7:11]) != mid:
                    break
                if len(buf) >= size + 8:
                    if buf[size + 7] != FRAME_END:
                        break  # malformed: the general way says so
                    payload = bytes(buf[7:7 + size])
                    drop_front(buf, size + 8)
                    return payload
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ConnectionLost(f"timed out waiting for method {mid >> 16}.{mid & 0xFFFF} from "
                                     f"{self.params.safe_url()}")
            readable, _, _ = select.select([self._socket()], [], [], remaining)
            if readable:
                self._recv()
        return self.wait_method_id(ch, mid)

    def _wait_for(self, ch: int, ids: set[int], what: str) -> bytes:
        """Read until a method in ids arrives on ch; frames read meanwhile are kept, in order."""
        deadline = time.monotonic() + self.params.timeout
        kept: list[Frame] = []
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ConnectionLost(f"timed out waiting for {what} from {self.params.safe_url()}")
                for index, item in enumerate(frames := self.read_frames(remaining)):
                    ftype, fch, payload = item
                    if ftype == FRAME_METHOD and fch == ch and method_id(payload) in ids:
                        kept.extend(frames[index + 1:])
                        return payload
                    kept.append(item)
        finally:
            if kept:
                self._backlog.extendleft(reversed(kept))


def _has_close_ok(frames: list[Frame]) -> bool:
    return any(ftype == FRAME_METHOD and ch == 0 and method_id(payload) == _CLOSE_OK for ftype, ch, payload in frames)
