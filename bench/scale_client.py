"""A small asyncio AMQP 0-9-1 client for bench/scale.py: cheap idle connections, pipelined declares and binds,
and a publisher with confirms that sends pre-encoded frames (pamqp encodes them once).

It holds no state per message beyond counters, so thousands of idle connections fit in one process and
one publisher runs near the speed of its socket. It speaks to any broker (lavinpy, LavinMQ, RabbitMQ)."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from pamqp import body as content_body
from pamqp import commands, frame, header
from pamqp import heartbeat as heartbeat_frame

HEAD = struct.Struct(">BHI")
HEARTBEAT = frame.marshal(heartbeat_frame.Heartbeat(), 0)


class BrokerClosed(RuntimeError):
    """The broker closed the connection or a channel (its reply code and text)."""


class Conn:
    """One connection with one channel (number 1)."""

    def __init__(self) -> None:
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.replies: asyncio.Queue = asyncio.Queue()
        self.acked = 0  # confirms (the highest delivery tag acked)
        self.nacked = 0
        self.delivered = 0
        self.error: str | None = None
        self.heartbeat = 0
        self.answered = 0  # replies to the current rpc so far
        self._task: asyncio.Task | None = None

    async def open(self, host: str, port: int, heartbeat: int = 0, vhost: str = "/") -> Conn:
        self.reader, self.writer = await asyncio.open_connection(host, port, limit=1 << 20)
        self.writer.write(frame.marshal(header.ProtocolHeader(), 0))
        await self._expect(commands.Connection.Start)
        self.writer.write(frame.marshal(commands.Connection.StartOk(
            client_properties={"product": "lavinpy-scale-bench"}, mechanism="PLAIN",
            response="\0guest\0guest"), 0))
        tune = await self._expect(commands.Connection.Tune)
        # Take the broker's suggestion if it has one and we asked for heartbeats, as clients do.
        self.heartbeat = min(heartbeat, tune.heartbeat) if heartbeat and tune.heartbeat else heartbeat
        self.writer.write(frame.marshal(commands.Connection.TuneOk(
            channel_max=tune.channel_max or 2047, frame_max=tune.frame_max or 131072, heartbeat=self.heartbeat), 0))
        self.writer.write(frame.marshal(commands.Connection.Open(virtual_host=vhost), 0))
        await self._expect(commands.Connection.OpenOk)
        self._task = asyncio.get_running_loop().create_task(self._read())
        await self.rpc([commands.Channel.Open()])
        return self

    async def _read_frame(self) -> tuple[int, int, bytes]:
        assert self.reader is not None
        kind, channel, size = HEAD.unpack(await self.reader.readexactly(7))
        payload = await self.reader.readexactly(size + 1)
        return kind, channel, payload[:-1]

    async def _expect(self, cls: type) -> Any:
        """During the handshake, before the reader task runs."""
        while True:
            kind, channel, payload = await self._read_frame()
            if kind != 1:
                continue
            _, _, method = frame.unmarshal(HEAD.pack(kind, channel, len(payload)) + payload + b"\xce")
            if isinstance(method, commands.Connection.Close):
                raise BrokerClosed(f"{method.reply_code} {method.reply_text}")
            if isinstance(method, cls):
                return method

    async def _read(self) -> None:
        assert self.reader is not None and self.writer is not None
        buf = b""
        try:
            while True:
                data = await self.reader.read(1 << 18)
                if not data:
                    self.error = self.error or "connection closed by the broker"
                    break
                buf += data
                pos = 0
                while len(buf) - pos >= 7:
                    kind, channel, size = HEAD.unpack_from(buf, pos)
                    end = pos + 8 + size
                    if end > len(buf):
                        break
                    if kind == 1:
                        self._method(buf[pos:end], channel)
                    pos = end
                buf = buf[pos:]
        except (OSError, asyncio.IncompleteReadError) as exc:
            self.error = self.error or f"connection lost: {exc}"
        self.replies.put_nowait(None)

    def _method(self, raw: bytes, channel: int) -> None:
        _, _, method = frame.unmarshal(raw)
        assert self.writer is not None
        if isinstance(method, commands.Basic.Ack):
            self.acked = max(self.acked, method.delivery_tag)
        elif isinstance(method, commands.Basic.Nack):
            self.nacked += 1
            self.acked = max(self.acked, method.delivery_tag)
        elif isinstance(method, commands.Basic.Deliver):
            self.delivered += 1
        elif isinstance(method, commands.Connection.Close):
            self.error = f"connection closed: {method.reply_code} {method.reply_text}"
            self.writer.write(frame.marshal(commands.Connection.CloseOk(), 0))
            self.replies.put_nowait(None)
        elif isinstance(method, commands.Channel.Close):
            self.error = f"channel closed: {method.reply_code} {method.reply_text}"
            self.writer.write(frame.marshal(commands.Channel.CloseOk(), channel))
            self.replies.put_nowait(None)
        else:
            self.replies.put_nowait(method)

    def send(self, data: bytes) -> None:
        assert self.writer is not None
        self.writer.write(data)

    async def rpc(self, methods: list, batch: int = 500) -> list:
        """Send the methods pipelined, ``batch`` at a time, each batch's replies awaited; returns the replies.
        Raises BrokerClosed (saying how many were answered) if the broker closes the channel or connection."""
        assert self.writer is not None
        replies: list = []
        self.answered = 0
        for start in range(0, len(methods), batch):
            chunk = methods[start:start + batch]
            self.writer.write(b"".join(frame.marshal(m, 1) for m in chunk))
            await self.writer.drain()
            for _ in chunk:
                reply = await self.replies.get()
                if reply is None:
                    raise BrokerClosed(f"{self.error} after {len(replies)} of {len(methods)}")
                replies.append(reply)
                self.answered += 1
        return replies

    async def confirm_select(self) -> None:
        await self.rpc([commands.Confirm.Select()])

    async def consume(self, queue: str) -> None:
        await self.rpc([commands.Basic.Consume(queue=queue, no_ack=True)])

    async def close(self, timeout: float = 5.0) -> None:
        if self.writer is None:
            return
        try:
            if self.error is None:
                bye = commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
                self.writer.write(frame.marshal(bye, 0))
                await asyncio.wait_for(self.replies.get(), timeout)
        except (TimeoutError, OSError):
            pass
        if self._task is not None:
            self._task.cancel()
        self.writer.close()


def publish_frames(exchange: str, routing_key: str, body: bytes) -> bytes:
    """One basic.publish with its header and body on channel 1, encoded once to be sent many times."""
    return (frame.marshal(commands.Basic.Publish(exchange=exchange, routing_key=routing_key), 1)
            + frame.marshal(header.ContentHeader(0, len(body), commands.Basic.Properties(delivery_mode=1)), 1)
            + frame.marshal(content_body.ContentBody(body), 1))


async def publish_confirmed(conn: Conn, messages: list[bytes], seconds: float, window: int = 1000) -> dict:
    """Publish the pre-encoded messages round robin for ``seconds`` with at most ``window`` unconfirmed;
    returns the confirmed rate (the broker has routed each message by then)."""
    assert conn.writer is not None
    await conn.confirm_select()
    loop = asyncio.get_running_loop()
    sent = 0
    batch = max(1, min(window // 4, 250))
    start = loop.time()
    deadline = start + seconds
    while loop.time() < deadline:
        if conn.error:
            raise BrokerClosed(conn.error)
        if sent - conn.acked + batch > window:
            await asyncio.sleep(0)
            await conn.writer.drain()
            continue
        conn.writer.write(b"".join(messages[(sent + i) % len(messages)] for i in range(batch)))
        sent += batch
        await conn.writer.drain()
    while conn.acked < sent and not conn.error and loop.time() < deadline + 30:
        await asyncio.sleep(0.01)
    elapsed = loop.time() - start
    return {"published": sent, "confirmed": conn.acked, "nacked": conn.nacked, "seconds": round(elapsed, 3),
            "rate": round(conn.acked / elapsed, 1)}


async def open_many(host: str, port: int, count: int, heartbeat: int, parallel: int = 100,
                    opened: list[Conn] | None = None) -> tuple[list[Conn], list]:
    """Open ``count`` connections with a channel each, ``parallel`` handshakes at a time. ``opened`` gets each
    connection as soon as it is open (so heartbeats can start while the others are still opening)."""
    gate = asyncio.Semaphore(parallel)
    errors: list[str] = []

    async def one() -> Conn | None:
        async with gate:
            try:
                conn = await Conn().open(host, port, heartbeat)
            except (OSError, BrokerClosed, asyncio.IncompleteReadError) as exc:
                errors.append(repr(exc))
                return None
            if opened is not None:
                opened.append(conn)
            return conn

    conns = [c for c in await asyncio.gather(*(one() for _ in range(count))) if c is not None]
    return conns, errors


async def keep_beating(conns: list[Conn], interval: float) -> None:
    """Send every connection a heartbeat frame every ``interval`` seconds, as an idle client does."""
    while True:
        await asyncio.sleep(interval)
        for c in conns:
            if c.error is None and c.writer is not None and not c.writer.is_closing():
                c.writer.write(HEARTBEAT)
