"""A connection's one output path, with backpressure.

Every frame for a client (deliveries, get-ok, returns, confirms, method replies) goes through
``send``/``send_many`` into one buffer that is written once per input batch. Queued bytes are
counted; past ``OUTPUT_FLUSH_BYTES`` the buffer is written at once, so the transport's own write
buffer (with its high-water mark) sees it. When that buffer is above its high-water mark the
transport calls ``pause_writing``: the connection then gets no deliveries and is not read (so it
produces no replies, returns or confirms) until the transport drains to its low-water mark and
calls ``resume_writing``.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..broker.broker import Broker

# Queued output written to the transport at once above this size (bytes), so a burst of
# deliveries cannot pile up in the connection before the transport's high-water check.
OUTPUT_FLUSH_BYTES = 256 * 1024
# Input handled for one client before the others get a turn: the event loop may otherwise call
# data_received for one busy socket many times in a row (libuv reads until the socket is empty).
INPUT_TURN_BYTES = 256 * 1024


class ConnectionOutput:
    """Mixin for AMQPConnection: output buffering and read/write flow control."""

    broker: Broker
    transport: asyncio.Transport | None
    channels: dict[int, Any]
    blocked: bool
    published: bool

    def init_output(self) -> None:
        self.writable = True  # False while the transport's write buffer is above its high-water mark
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._flush_scheduled = False
        self._reading_paused = False
        self._input_turn = 0
        self._yielding = False
        self._last_send = time.monotonic()

    def send(self, data: bytes) -> None:
        self._out.append(data)
        self._out_bytes += len(data)
        self._after_send()

    def send_many(self, frames: list[bytes]) -> None:
        self._out.extend(frames)
        for frame in frames:
            self._out_bytes += len(frame)
        self._after_send()

    def _after_send(self) -> None:
        if self._out_bytes > OUTPUT_FLUSH_BYTES:
            self.flush_output()  # may call pause_writing before the next delivery is made
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self.broker.schedule_output(self)

    def flush_output(self) -> None:
        """Write everything queued for this client in one system call."""
        self._flush_scheduled = False
        out, self._out = self._out, []
        self._out_bytes = 0
        transport = self.transport
        if out and transport is not None and not transport.is_closing():
            # One buffer per flush: uvloop drains a buffer of many tiny pieces very slowly.
            transport.write(out[0] if len(out) == 1 else b"".join(out))
            self._last_send = time.monotonic()

    # --- asyncio flow control callbacks -------------------------------------------------------
    def pause_writing(self) -> None:
        self.writable = False
        self.update_reading()

    def resume_writing(self) -> None:
        self.writable = True
        self.update_reading()
        for channel in self.channels.values():
            self.schedule_channel_deliveries(channel)

    def update_reading(self) -> None:
        """Read from the client unless its output is backed up or a resource alarm blocks it."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        paused = not self.writable or self._yielding or (self.blocked and self.published)
        if paused != self._reading_paused:
            self._reading_paused = paused
            if paused:
                transport.pause_reading()
            else:
                transport.resume_reading()

    def take_input_turn(self, nbytes: int) -> None:
        """Count input; past a turn's worth, stop reading until the other clients were served."""
        self._input_turn += nbytes
        if self._input_turn > INPUT_TURN_BYTES and not self._yielding:
            self._yielding = True
            self.update_reading()
            asyncio.get_running_loop().call_soon(self._end_turn)

    def _end_turn(self) -> None:
        self._input_turn = 0
        self._yielding = False
        self.update_reading()

    def schedule_channel_deliveries(self, channel: Any) -> None:
        raise NotImplementedError
