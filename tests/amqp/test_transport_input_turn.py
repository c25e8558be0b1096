"""The driver's view of a publisher's reader thread for the output hold (``ConnectionOutput.run_pending``):
input the loop has not taken yet still waits while the thread is paused only for the other clients' turn
(it resumes in the next turn of the loop), and no longer waits once it is paused for anything else."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from session_client import Client, Harness

from lavinpy.amqp.output import INPUT_TURN_BYTES
from lavinpy.amqp.transport import AMQPProtocol


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path)
    yield h
    h.close()


@pytest.fixture
def client(harness: Harness) -> Client:
    c = harness.connect()
    c.handshake()
    return c


class PausableReader:
    """A reader thread as the driver sees it: a wake-up descriptor and pause/resume."""

    wake_fd = 99

    def __init__(self) -> None:
        self.paused = False
        self.takes = 0

    def set_paused(self, paused: bool) -> None:
        self.paused = paused

    def take(self, limit: int) -> tuple[bytes, int]:
        self.takes += 1
        return b"", 0

    @property
    def buffered(self) -> int:
        return 1

    def answered(self) -> None:
        pass


class QuietLoop:
    """The loop calls the driver makes: watching the wake-up descriptor and its timers."""

    def __init__(self) -> None:
        self.watched: set[int] = set()

    def add_reader(self, fd: int, callback: Any) -> None:
        self.watched.add(fd)

    def remove_reader(self, fd: int) -> None:
        self.watched.discard(fd)

    def call_later(self, delay: float, callback: Any, *args: Any) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(3600, callback, *args)  # (never run here)


class OpenTransport:
    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


def test_a_reader_paused_for_the_other_clients_turn_still_has_input_waiting(harness: Harness,
                                                                            client: Client) -> None:
    sessions = harness.sessions
    conn = client.conn

    async def drive() -> None:
        driver = AMQPProtocol(sessions)
        driver.conn, driver.transport = conn, OpenTransport()  # type: ignore[assignment]
        loop = QuietLoop()
        driver._reader, driver._loop = PausableReader(), loop  # type: ignore[assignment]
        loop.watched.add(PausableReader.wake_fd)
        conn.driver = driver
        sessions.input_waiting = True  # the reader's last take left input behind

        reader = driver._reader
        driver._reader_watched = True
        conn.count_input_turn(INPUT_TURN_BYTES + 1)  # a turn's worth read: the others' turn first
        driver.pump()
        driver._take_input()  # (the wake-up fd stays watched for a turn's pause: the loop calls this)
        assert reader.takes == 0  # not taken before the others' turn
        assert sessions.input_waiting  # taken in the next turn: the consumers' deliveries come then

        conn.end_input_turn()
        driver.pump()
        driver._take_input()
        assert reader.takes == 1 and not reader.paused and loop.watched and sessions.input_waiting

        conn.set_writable(False)  # its output backed up: not read until the client reads
        driver.pump()
        assert reader.paused and not loop.watched
        assert not sessions.input_waiting

        conn.set_writable(True)
        driver.pump()
        assert not reader.paused and loop.watched
        for handle in driver._timers.values():
            handle.cancel()

        # A turn's pause that turns into a longer one meanwhile (the output backs up before the turn
        # ends: no new pause is asked for): the loop's next call stops the thread and the watch.
        conn.count_input_turn(INPUT_TURN_BYTES + 1)
        driver.pump()
        conn.set_writable(False)
        driver.pump()
        driver._take_input()
        assert reader.takes == 1 and reader.paused and not loop.watched
        assert not sessions.input_waiting
        conn.end_input_turn()
        driver.pump()
        assert reader.paused and not loop.watched  # still unwritable
        conn.set_writable(True)
        driver.pump()
        driver._take_input()
        assert reader.takes == 2 and not reader.paused and loop.watched
        for handle in driver._timers.values():
            handle.cancel()

    asyncio.run(drive())


def test_a_read_of_many_methods_is_handled_over_turns_in_order(client: Client) -> None:
    """One read of 1,700 small methods (a client that never waits for answers): METHODS_PER_TURN of
    them are handled, then the others' turn (the INPUT_TURN timer, reading paused), then the rest,
    and what arrived meanwhile after them, in order. Handling such a read of 256 KiB at once held the
    loop, and every other client, for up to 0.6 s."""
    from pamqp import commands

    from lavinpy.amqp.connection import METHODS_PER_TURN
    from lavinpy.amqp.effects import Effect, SetTimer, TimerKind

    client.open_channel(1)
    client.read()
    client.effects.clear()
    count = 3 * METHODS_PER_TURN + 200
    client.send(*[(1, commands.Basic.Qos(prefetch_count=n + 1)) for n in range(count)])
    first = client.names()
    assert first == [(1, "Basic.QosOk")] * METHODS_PER_TURN
    assert SetTimer(TimerKind.INPUT_TURN, 0.0) in client.effects and Effect.PAUSE_READING in client.effects
    client.send((1, commands.Queue.Declare(queue="", exclusive=True)))  # read before the pause took effect
    replies = []
    for _ in range(5):
        client.conn.timer_fired(TimerKind.INPUT_TURN)
        replies += client.names()
    assert replies == [(1, "Basic.QosOk")] * (count - METHODS_PER_TURN) + [(1, "Queue.DeclareOk")]
    assert client.conn.channels[1].prefetch_count == count


def test_a_read_of_small_methods_is_decoded_a_turn_at_a_time(client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """256 KiB of basic.qos in one read (about 12,000 methods): no more than METHODS_PER_TURN of them are
    decoded in the call that reads it, the rest waits undecoded in the frame reader until the next turns,
    and every one is answered, in order, with a basic.publish in the middle handled in its place. The
    reader decoded the whole read before any of it was handled: 91 ms of the loop, every client waiting."""
    from pamqp import commands, frame

    import lavinpy.wire.reader as reader_module
    from lavinpy.amqp.connection import METHODS_PER_TURN
    from lavinpy.amqp.effects import Effect, TimerKind

    decoded = 0
    decode = reader_module._decode_method

    def counted(src: bytes, start: int, fend: int) -> Any:
        nonlocal decoded
        decoded += 1
        return decode(src, start, fend)

    monkeypatch.setattr(reader_module, "_decode_method", counted)
    client.open_channel(1)
    client.send((1, commands.Queue.Declare(queue="q")))
    client.read()
    client.effects.clear()
    qos = [frame.marshal(commands.Basic.Qos(prefetch_count=n % 1000 + 1), 1) for n in range(256 * 1024 // 19)]
    half = len(qos) // 2
    publish = b"".join(frame.marshal(f[1], f[0]) for f in client.publish(1, "q", b"m"))
    data = b"".join(qos[:half]) + publish + b"".join(qos[half:])
    decoded = 0
    client.conn.receive_data(data)
    assert decoded <= METHODS_PER_TURN
    assert client.conn.reader.buffered > len(data) * 0.9  # the rest, undecoded
    assert client.names() == [(1, "Basic.QosOk")] * decoded
    assert Effect.PAUSE_READING in client.effects
    queue = client.harness.broker.vhosts["/"].queues["q"]
    answered = decoded
    turns = 1
    while client.conn.reader.buffered:
        assert queue.message_count == (answered > half)
        decoded = 0
        client.conn.timer_fired(TimerKind.INPUT_TURN)
        assert decoded <= METHODS_PER_TURN
        answered += len(client.names())
        turns += 1
    assert answered == len(qos) and queue.message_count == 1
    assert turns >= len(qos) // METHODS_PER_TURN
    assert client.conn.channels[1].prefetch_count == (len(qos) - 1) % 1000 + 1
