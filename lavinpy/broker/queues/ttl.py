"""Message and queue expiry: the expiry time of a message, and one-shot loop timers.

A queue with a TTL never scans its messages: only the head can expire (as in RabbitMQ's classic
queues), so one timer armed for the head's expiry time is enough. Messages further back are checked
when they reach the head, and again when they are about to be delivered.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from ...wire.properties import PropertiesError, peek_expiration
from ..settings.arguments import ArgumentError, parse_expiration

_EXPIRATION_FLAG_HIGH = (1 << 8) >> 8  # the expiration bit within the first property-flags byte


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def message_ttl(properties: bytes) -> int | None:
    """The per-message TTL (ms) from the expiration property, or None (absent or unreadable)."""
    if not properties[0] & _EXPIRATION_FLAG_HIGH:
        return None
    try:
        text = peek_expiration(properties)
        return None if text is None else parse_expiration(text)
    except (PropertiesError, ArgumentError):
        return None  # validated when published; an old record with a bad value never expires


def message_expiry(timestamp: int, properties: bytes, queue_ttl: int | None) -> int | None:
    """When a message stored at ``timestamp`` expires (ms since the epoch): the smaller TTL wins."""
    ttl = message_ttl(properties)
    if ttl is None or (queue_ttl is not None and queue_ttl < ttl):
        ttl = queue_ttl
    return None if ttl is None else timestamp + ttl


class Timer:
    """One ``loop.call_at`` handle for a wall-clock time (ms since the epoch).

    ``arm_before`` only ever moves the timer earlier, so arming it for every new message costs
    nothing once it is set; ``reset`` re-arms it unconditionally (x-expires).
    """

    __slots__ = ("_callback", "_handle", "at")

    def __init__(self, callback: Callable[[], None]) -> None:
        self._callback = callback
        self._handle: asyncio.TimerHandle | None = None
        self.at: int | None = None

    @property
    def armed(self) -> bool:
        return self._handle is not None

    def arm_before(self, at_ms: int) -> None:
        if self._handle is not None and self.at is not None and self.at <= at_ms:
            return
        self.reset(at_ms)

    def reset(self, at_ms: int) -> None:
        self.cancel()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # not serving yet: the vhost re-arms its queues' timers when it starts
        delay = max(0, at_ms - now_ms()) / 1000
        self._handle = loop.call_at(loop.time() + delay, self._fire)
        self.at = at_ms

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = None
        self.at = None

    def _fire(self) -> None:
        self._handle = None
        self.at = None
        self._callback()
