"""A connection's one output path, with backpressure, without a transport.

Every frame for a client (deliveries, get-ok, returns, confirms, method replies) goes through
``send``/``send_many`` into one buffer that the driver writes once per input batch, as one buffer.
Queued bytes are counted; past ``OUTPUT_FLUSH_BYTES`` the driver is asked to write at once, so the
transport's own write buffer (with its high-water mark) sees it. When that buffer is above its
high-water mark the driver calls ``set_writable(False)``: the connection then gets no deliveries
and is not read (so it produces no replies, returns or confirms) until ``set_writable(True)``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from ..broker.ops import WindowRates
from ..wire.accel import cwire
from .connection_states import CLOSED
from .delivery_round import init_round
from .effects import ConnectionEffect, Effect, SetTimer, TimerKind

# Queued output written to the transport at once above this size (bytes), so a burst of
# deliveries cannot pile up in the connection before the transport's high-water check.
OUTPUT_FLUSH_BYTES = 256 * 1024
# A consuming connection's output smaller than this may wait up to OUTPUT_HOLD_TURNS turns of the loop while
# more input waits to be read (run_pending). 8 turns: at 1,000 consumers of one queue (prefetch 100) a send()
# carries about 30 deliveries instead of 7 (a publisher's input taken every turn), and each send saved is a
# read of the client's acks saved too.
OUTPUT_HOLD_BYTES = 16 * 1024
OUTPUT_HOLD_TURNS = 8
# Input handled for one client before the others get a turn: the event loop may otherwise call
# data_received for one busy socket many times in a row (libuv reads until the socket is empty).
INPUT_TURN_BYTES = 256 * 1024


class ConnectionDriver(Protocol):
    """Owner of a connection's socket: writes its output and carries out its effects."""

    def pump(self) -> None: ...


class OutputScheduler(Protocol):
    """What a connection's output needs of the session layer: a flush once the current batch of
    input (or round of deliveries) is done, for all connections with output at once (the model's
    turn, ``broker.scheduler``, calls its ``run_pending``)."""

    def schedule_output(self, connection: ConnectionOutput) -> None: ...

    input_waiting: bool  # a reader thread holds input the loop has not taken yet
    consuming: set[Any]  # the connections that consume (or fetched)


class ConnectionOutput:
    """AMQPConnection's output half: output buffering, effects and read/write flow control.

    What it needs of the connection it is part of: the attributes below, and
    ``schedule_channel_deliveries`` (the connection's channels get deliveries again once writable).
    """

    # Slots: a connection has more attributes than an instance dict shares keys for (30 in CPython 3.11),
    # so each would carry a dict of its own (about 1.5 KiB of every idle connection's cost).
    __slots__ = ("driver", "writable", "_out", "_out_bytes", "_effects", "_flush_scheduled", "reading_paused",
                 "input_held", "_input_turn", "_yielding", "_output_held", "last_send", "recv_oct", "recv_cnt",
                 "send_oct", "send_cnt", "byte_rates")

    sessions: OutputScheduler
    channels: dict[int, Any]
    blocked: bool  # a resource alarm is on
    published: bool  # the client has published (a blocked one is not read from then on)
    state: int  # connection_states

    def init_output(self) -> None:
        self.driver: ConnectionDriver | None = None
        self.writable = True  # False while the transport's write buffer is above its high-water mark
        self._out: list[bytes | memoryview] = []
        self._out_bytes = 0
        self._effects: list[ConnectionEffect] = []
        self._flush_scheduled = False
        self.reading_paused = False  # as last asked of the driver (PAUSE_READING / RESUME_READING)
        self.input_held = False  # the connection handles no input for now (a login being decided)
        self._input_turn = 0
        self._yielding = False
        self._output_held = 0  # turns its output waited for more (run_pending)
        self.last_send = time.monotonic()  # when output was last taken by the driver
        # RabbitMQ's recv_oct/recv_cnt/send_oct/send_cnt: bytes and socket reads or writes (one write
        # per flush of queued frames here, one read per batch of input).
        self.recv_oct = self.recv_cnt = self.send_oct = self.send_cnt = 0
        self.byte_rates = WindowRates((0, 0))

    # --- output and effects, taken by the driver ----------------------------------------------
    def data_to_send(self) -> list[bytes | memoryview]:
        """The frames queued since the last call (the driver writes them as one buffer)."""
        out = self._out
        if out:
            self.send_oct += self._out_bytes
            self.send_cnt += 1
            self._out = []
            self._out_bytes = 0
            self.last_send = time.monotonic()
        return out

    def effects_waiting(self) -> bool:
        return bool(self._effects)

    def take_effects(self) -> list[ConnectionEffect]:
        effects = self._effects
        if effects:
            self._effects = []
        return effects

    def effect(self, effect: ConnectionEffect) -> None:
        self._effects.append(effect)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.sessions.schedule_output(self)

    def send(self, data: bytes) -> None:
        self._out.append(data)
        self._out_bytes += len(data)
        # (the same as in send_many, inline: this runs for every delivery)
        if self._out_bytes > OUTPUT_FLUSH_BYTES:
            self.flush_output()  # may make the connection unwritable before the next delivery
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self.sessions.schedule_output(self)

    def send_many(self, frames: list[bytes | memoryview]) -> None:
        self._out += frames
        self._out_bytes += len(frames[0]) if len(frames) == 1 else sum(map(len, frames))
        if self._out_bytes > OUTPUT_FLUSH_BYTES:
            self.flush_output()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self.sessions.schedule_output(self)

    def flush_output(self) -> None:
        """Have the driver write everything queued for this client (in one system call)."""
        self._flush_scheduled = False
        self._output_held = 0
        if self.driver is not None:
            self.driver.pump()

    def run_pending(self) -> None:
        """The model's turn (broker.scheduler.PendingWork): the output written, or held for up to
        OUTPUT_HOLD_TURNS more turns while more input waits to be read (a reader thread's backlog: its
        deliveries come in the next turns), when the connection consumes, a consumer of it has room in
        its prefetch window (else nothing more can come, and holding would only delay its acks) and the
        output is small and asks nothing else of the socket. A consumer among many then gets several
        turns' deliveries per send() while a publisher's input streams in faster than the loop takes it
        (when its messages wait in any case), and its output is never held otherwise."""
        sessions = self.sessions
        if (self._output_held < OUTPUT_HOLD_TURNS and sessions.input_waiting and self._out_bytes < OUTPUT_HOLD_BYTES
                and not self._effects and self in sessions.consuming and _have_room(self)):
            self._output_held += 1
            sessions.schedule_output(self)  # (still marked scheduled)
            return
        # flush_output, inline: a consumer's every write comes here (a Python frame less a write)
        self._flush_scheduled = False
        self._output_held = 0
        if self.driver is not None:
            self.driver.pump()

    # --- flow control ---------------------------------------------------------------------------
    def set_writable(self, writable: bool) -> None:
        """The driver's transport went above (False) or back below (True) its high-water mark."""
        self.writable = writable
        self.update_reading()
        if writable:
            for channel in self.channels.values():
                self.schedule_channel_deliveries(channel)

    def update_reading(self) -> None:
        """Read from the client unless its output is backed up, a resource alarm blocks it or its input
        is held."""
        if self.state >= CLOSED:  # after close-ok the client's leftovers must drain: keep reading
            return
        paused = not self.writable or self._yielding or (self.blocked and self.published) or self.input_held
        if paused != self.reading_paused:
            self.reading_paused = paused
            self.effect(Effect.PAUSE_READING if paused else Effect.RESUME_READING)

    def input_yielded(self) -> bool:
        """Reading is paused only for the other clients' turn: it resumes in the next turn of the loop."""
        return self._yielding and self.writable and not self.input_held and not (self.blocked and self.published)

    def count_input_turn(self, nbytes: int) -> None:
        """``nbytes`` of input handled: past a turn's worth, the other clients get theirs first."""
        self._input_turn += nbytes
        if self._input_turn > INPUT_TURN_BYTES:
            self.yield_input_turn()

    def yield_input_turn(self) -> None:
        """A turn's worth of input was read: stop reading until the other clients were served."""
        if not self._yielding:
            self._yielding = True
            self.update_reading()
            self.effect(SetTimer(TimerKind.INPUT_TURN, 0.0))

    def end_input_turn(self) -> None:
        self._input_turn = 0
        self._yielding = False
        self.update_reading()

    def schedule_channel_deliveries(self, channel: Any) -> None:
        raise NotImplementedError

    def consumers_have_room(self) -> bool:
        raise NotImplementedError


def _room_of(conn: ConnectionOutput) -> bool:
    return conn.consumers_have_room()


# The hold's room check: ``consumers_have_room``, compiled (without its Python frame) once the connection
# class registered its method (init_room_check); the compiled check calls the method for any other class.
_have_room: Callable[[ConnectionOutput], bool] = _room_of


def init_room_check(method: Callable[[Any], bool]) -> None:
    """``method`` (AMQPConnection.consumers_have_room) is the check the compiled one computes (its twin)."""
    global _have_room
    if cwire is not None:
        cwire.init_room_check(method)
        _have_room = cwire.consumers_have_room


# A round of deliveries (delivery_round) appends to each consumer's output as send_many does, in one call.
init_round(ConnectionOutput.send_many, OUTPUT_FLUSH_BYTES)
