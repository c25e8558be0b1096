"""Protocol fuzzer: recorded pika sessions, mutated, replayed against one running lavinpy.

    python3 bench/fuzz.py --url amqp://guest:guest@127.0.0.1:5672/ --frames 1000000 --seconds 3600

Records what real pika clients send (through a local proxy), then replays those byte streams over
many connections with frames mutated (bit flips, truncation, splices, length fields, duplicates,
drops, channel swaps). Every reply is scanned: a connection.close or channel.close with 541
(INTERNAL_ERROR) is a broker bug. Exits non-zero when one is seen. The e2e test
tests/e2e/test_fuzz.py runs a bounded version of the same loop.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlparse

_FRAME_HEAD = struct.Struct(">BHI")
_CLOSE_INDEXES = {0x000A0032: "connection.close", 0x00140028: "channel.close"}


# --- recording ---------------------------------------------------------------------------------------

def _pika_sessions(url: str) -> None:
    """The client sessions to record: a broad sample of what pika sends, nothing that piles up
    (exclusive queues, capped lengths, transient messages)."""
    from decimal import Decimal

    import pika

    params = pika.URLParameters(url)
    full = pika.BasicProperties(
        content_type="application/json", content_encoding="utf-8", delivery_mode=1, priority=3,
        correlation_id="c-1", reply_to="replies", expiration="60000", message_id="m-1",
        timestamp=1_700_000_000, type="kind", user_id="guest", app_id="fuzz", cluster_id="",
        headers={"s": "text", "i": 7, "l": 2**40, "d": Decimal("1.25"), "b": True, "n": None, "x": b"\x00\x01",
                 "a": [1, "two", {"three": 3}], "t": {"nested": {"deep": [1, 2]}}})
    # Publishing, confirms, consuming, acks of every kind.
    with pika.BlockingConnection(params) as conn:
        ch = conn.channel()
        ch.exchange_declare("fuzz.direct", "direct", auto_delete=True)
        ch.exchange_declare("fuzz.headers", "headers", auto_delete=True)
        # Server-named and exclusive, then named "" (the channel's last declared queue): a replayed
        # session gets its own queue, deleted with its connection.
        ch.queue_declare("", exclusive=True, arguments={
            "x-max-length": 20, "x-message-ttl": 60000, "x-overflow": "drop-head"})
        q = ""
        ch.queue_bind(q, "fuzz.direct", "rk")
        ch.queue_bind(q, "fuzz.headers", "", arguments={"x-match": "any", "i": 7, "s": "text"})
        ch.confirm_delivery()
        for i in range(6):
            ch.basic_publish("fuzz.direct", "rk", b"body-%d" % i * (i + 1), full)
            ch.basic_publish("fuzz.headers", "", b"h", full)
            ch.basic_publish("fuzz.direct", "rk", b"", pika.BasicProperties(delivery_mode=1))
        ch.basic_qos(prefetch_count=5)
        # Settled right after basic.get: a replay pipelines everything, and a get is answered in order
        # (a consumer's deliveries would arrive after acks sent blindly behind basic.consume).
        for settle in ("ack", "nack", "reject", "ack"):
            method, _props, _body = ch.basic_get(q)
            if method is None:
                break
            if settle == "ack":
                ch.basic_ack(method.delivery_tag, multiple=True)
            elif settle == "nack":
                ch.basic_nack(method.delivery_tag, requeue=True)
            else:
                ch.basic_reject(method.delivery_tag, requeue=False)
        for method, _props, _body in ch.consume(q, auto_ack=True, inactivity_timeout=0.3):
            if method is None:
                break
        ch.cancel()
        ch.queue_unbind(q, "fuzz.direct", "rk")
        ch.queue_purge(q)
        ch.queue_delete(q)
    # Transactions, basic.get, recover, exchange-to-exchange bindings, channel churn.
    with pika.BlockingConnection(params) as conn:
        ch = conn.channel()
        ch.exchange_declare("fuzz.topic", "topic", auto_delete=True)
        ch.exchange_declare("fuzz.fanout", "fanout", auto_delete=True)
        ch.exchange_bind("fuzz.fanout", "fuzz.topic", "a.#")
        ch.queue_declare("", exclusive=True, arguments={"x-max-length": 10})
        q = ""
        ch.queue_bind(q, "fuzz.fanout")
        ch.tx_select()
        for i in range(4):
            ch.basic_publish("fuzz.topic", "a.b.c", b"tx-%d" % i, full)
        ch.tx_commit()
        ch.basic_publish("fuzz.topic", "a.b", b"rolled back")
        ch.tx_rollback()
        for _ in range(3):
            ch.basic_get(q, auto_ack=False)
        ch.basic_recover(requeue=True)
        ch.exchange_unbind("fuzz.fanout", "fuzz.topic", "a.#")
        ch.exchange_delete("fuzz.fanout")
        ch.close()
        for _ in range(3):
            extra = conn.channel()
            extra.basic_qos(prefetch_count=1, global_qos=True)
            extra.close()


class _Recorder:
    """A TCP proxy that keeps every byte the clients send, one list entry per connection."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.sessions: list[bytes] = []

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    record: bytearray | None) -> None:
        try:
            while data := await reader.read(65536):
                if record is not None:
                    record += data
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    async def _client(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        s_reader, s_writer = await asyncio.open_connection(self.host, self.port)
        record = bytearray()
        await asyncio.gather(self._pipe(c_reader, s_writer, record), self._pipe(s_reader, c_writer, None))
        self.sessions.append(bytes(record))


def record_sessions(url: str) -> list[list[bytes]]:
    """Run the pika sessions through a recording proxy; each session as [protocol header, frames...]."""
    parsed = urlparse(url)
    recorder = _Recorder(parsed.hostname or "127.0.0.1", parsed.port or 5672)
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(asyncio.start_server(recorder._client, "127.0.0.1", 0))
    proxy_port = server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        _pika_sessions(parsed._replace(netloc=f"{parsed.username}:{parsed.password}@127.0.0.1:{proxy_port}")
                       .geturl())
        time.sleep(0.3)
    finally:
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
    return [split_frames(raw) for raw in recorder.sessions if raw]


def split_frames(raw: bytes) -> list[bytes]:
    out, pos = [raw[:8]], 8
    while pos + 7 <= len(raw):
        size = _FRAME_HEAD.unpack_from(raw, pos)[2]
        out.append(raw[pos:pos + size + 8])
        pos += size + 8
    return out


# --- mutation ----------------------------------------------------------------------------------------

_LENGTHS = (0, 1, 2, 3, 4, 0x7F, 0x80, 0xFF, 0x100, 0xFFFF, 0x10000, 0x7FFFFFFF, 0xFFFFFFFF)


def mutate(frame: bytes, rng: random.Random, pool: list[bytes]) -> bytes:
    """One frame, damaged in one of several ways."""
    data = bytearray(frame)
    how = rng.randrange(8)
    if how == 0 and data:  # bit flips
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
    elif how == 1:  # truncation
        del data[rng.randrange(len(data) + 1):]
    elif how == 2:  # splice: a piece of another frame inside this one
        other = rng.choice(pool)
        a, b = sorted(rng.randrange(len(other) + 1) for _ in range(2))
        at = rng.randrange(len(data) + 1)
        data[at:at] = other[a:b]
    elif how == 3 and len(data) >= 8:  # frame size field
        size = _FRAME_HEAD.unpack_from(data)[2]
        new = rng.choice((size - 1, size + 1, 0, rng.choice(_LENGTHS)))
        struct.pack_into(">I", data, 3, new & 0xFFFFFFFF)
    elif how == 4 and len(data) > 12:  # a length inside the payload (tables, long strings)
        at = rng.randrange(7, len(data) - 4)
        struct.pack_into(">I", data, at, rng.choice(_LENGTHS))
    elif how == 5 and len(data) > 8:  # a short-string length or type letter
        at = rng.randrange(7, len(data) - 1)
        data[at] = rng.choice((0, 1, 0x7F, 0xFF, *b"FAStTlxVDZ"))
    elif how == 6 and len(data) >= 3:  # another channel
        struct.pack_into(">H", data, 1, rng.choice((0, 1, 2, 7, 0xFFFF)))
    else:  # random bytes
        at = rng.randrange(len(data) + 1)
        data[at:at + rng.randint(0, 8)] = rng.randbytes(rng.randint(1, 8))
    return bytes(data)


HANDSHAKE_FRAMES = 4  # protocol header, start-ok, tune-ok, connection.open


def mutated_session(session: list[bytes], rng: random.Random, pool: list[bytes],
                    rate: float) -> tuple[list[bytes], int]:
    """(frames to send, frames mutated). The handshake is usually kept, so mutations reach the
    states behind it; a mutated frame is damaged, dropped or duplicated."""
    out, mutated = [], 0
    keep_handshake = rng.random() < 0.9
    for i, frame in enumerate(session):
        roll = rng.random()
        if (i < HANDSHAKE_FRAMES and keep_handshake) or roll >= rate:
            out.append(frame)
            continue
        mutated += 1
        if roll < rate * 0.08:
            out.append(b"")  # dropped
        elif roll < rate * 0.16:
            out.append(frame + frame)  # duplicated
        else:
            out.append(mutate(frame, rng, pool))
    return out, mutated


# --- replay ------------------------------------------------------------------------------------------

@dataclass
class FuzzStats:
    connections: int = 0
    frames_sent: int = 0
    frames_mutated: int = 0
    close_codes: dict[int, int] = field(default_factory=dict)
    internal_errors: list[str] = field(default_factory=list)


def scan_replies(data: bytes, stats: FuzzStats) -> None:
    """Count the close codes in what the broker sent; keep every 541 with its text."""
    pos = 8 if data.startswith(b"AMQP") else 0
    while pos + 7 <= len(data):
        frame_type, _channel, size = _FRAME_HEAD.unpack_from(data, pos)
        payload = data[pos + 7:pos + 7 + size]
        pos += size + 8
        if frame_type == 1 and len(payload) >= 7 and struct.unpack_from(">I", payload)[0] in _CLOSE_INDEXES:
            code = struct.unpack_from(">H", payload, 4)[0]
            stats.close_codes[code] = stats.close_codes.get(code, 0) + 1
            if code == 541:
                stats.internal_errors.append(payload[7:7 + payload[6]].decode(errors="replace"))


_OPEN_OK = struct.pack(">HH", 10, 41)


async def _replay_one(host: str, port: int, frames: list[bytes], chunks: list[int], stats: FuzzStats,
                      idle: float) -> None:
    """Send the handshake, wait for connection.open-ok, then the rest in separate writes (frames
    read together are parsed together, and a broken one would hide the ones before it)."""
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError:
        return
    replies = bytearray()

    async def read_until(done: bytes | None) -> bool:
        while done is None or done not in replies:
            data = await asyncio.wait_for(reader.read(65536), idle)
            if not data:
                return False
            replies.extend(data)
        return True

    try:
        writer.write(b"".join(frames[:HANDSHAKE_FRAMES]))
        if await read_until(_OPEN_OK):
            start = HANDSHAKE_FRAMES
            for size in chunks:
                writer.write(b"".join(frames[start:start + size]))
                start += size
                await writer.drain()
                await asyncio.sleep(0.001)
                if start >= len(frames):
                    break
            await read_until(None)
    except (TimeoutError, OSError):
        pass
    finally:
        writer.close()
    stats.connections += 1
    scan_replies(bytes(replies), stats)


async def replay(host: str, port: int, sessions: list[list[bytes]], *, frames: int, seconds: float,
                 seed: int = 1, concurrency: int = 48, rate: float = 0.35, idle: float = 0.4,
                 stats: FuzzStats | None = None) -> FuzzStats:
    """Replay mutated sessions until ``frames`` mutated frames were sent or ``seconds`` passed."""
    stats = stats or FuzzStats()
    rng = random.Random(seed)
    pool = [frame for session in sessions for frame in session]
    close_frame = b"\x01\x00\x00\x00\x00\x00\x0b\x00\x0a\x00\x32\x00\xc8\x00\x00\x00\x00\x00\xce"
    deadline = time.monotonic() + seconds
    running: set[asyncio.Task] = set()
    while stats.frames_mutated < frames and time.monotonic() < deadline:
        while len(running) >= concurrency:
            _done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
        session = rng.choice(sessions)
        # Mostly light damage, so that later frames still meet the states a session builds up.
        frames_out, mutated = mutated_session(session, rng, pool, rng.choice((rate / 8, rate / 3, rate)))
        stats.frames_sent += len(session)
        stats.frames_mutated += mutated
        # A trailing connection.close makes an in-sync connection end at once.
        frames_out.append(close_frame)
        chunks = [rng.randint(1, 12) for _ in range(len(frames_out))]
        running.add(asyncio.create_task(_replay_one(host, port, frames_out, chunks, stats, idle)))
    if running:
        await asyncio.wait(running)
    return stats


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="amqp://guest:guest@127.0.0.1:5672/")
    parser.add_argument("--frames", type=int, default=1_000_000, help="mutated frames to send")
    parser.add_argument("--seconds", type=float, default=600.0, help="stop after this long anyway")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=48)
    args = parser.parse_args()
    parsed = urlparse(args.url)
    sessions = record_sessions(args.url)
    print(f"recorded {len(sessions)} sessions, {sum(map(len, sessions))} frames", flush=True)
    started = time.monotonic()
    stats = asyncio.run(replay(parsed.hostname or "127.0.0.1", parsed.port or 5672, sessions,
                               frames=args.frames, seconds=args.seconds, seed=args.seed,
                               concurrency=args.concurrency))
    elapsed = time.monotonic() - started
    print(f"{stats.frames_mutated} mutated frames ({stats.frames_sent} in all) over {stats.connections} "
          f"connections in {elapsed:.1f} s; close codes {dict(sorted(stats.close_codes.items()))}")
    for text in stats.internal_errors[:20]:
        print("541:", text)
    return 1 if stats.internal_errors else 0


if __name__ == "__main__":
    sys.exit(main())
