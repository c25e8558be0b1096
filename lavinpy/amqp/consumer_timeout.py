"""Consumer timeout: a delivery left unacknowledged too long closes its channel (406) and is requeued.

No per-delivery timestamps: a periodic sweep looks at each channel's oldest unacked delivery and
remembers when it first saw it. If the same delivery is still the oldest one ``timeout`` later, the
channel is closed. Deliveries are therefore never timed out early, and late by at most one sweep.
The timeout of a delivery is its consumer's ``x-consumer-timeout``, else its queue's setting
(argument or policy), else the broker's ``consumer_timeout``; 0 means none.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from ..wire.constants import PRECONDITION_FAILED
from ..wire.errors import AMQPChannelError

if TYPE_CHECKING:
    from ..broker.ops.unacked_book import Unacked
    from .channel import Channel

SWEEP_INTERVAL = 0.25  # seconds


class HasChannels(Protocol):
    """A connection, as the sweep sees it."""

    channels: dict[int, Channel]


def delivery_timeout(item: Unacked, default: int) -> int:
    """The timeout (ms) that applies to one unacked delivery."""
    consumer = item.consumer
    if consumer is not None:
        value = consumer.arguments.get("x-consumer-timeout")
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    settings = getattr(item.queue, "settings", None)
    if settings is not None and settings.consumer_timeout is not None:
        return settings.consumer_timeout
    return default


def sweep(connections: Iterable[HasChannels], default: int, now: float | None = None) -> int:
    """Check every open channel once; returns how many were closed."""
    now = time.monotonic() if now is None else now
    closed = 0
    for connection in list(connections):
        for channel in list(connection.channels.values()):
            unacked = channel.deliveries.unacked
            tag = unacked.oldest()
            if tag is None or channel.closing:
                channel.oldest_unacked_seen = None
                continue
            seen = channel.oldest_unacked_seen
            if seen is None or seen[0] != tag:
                channel.oldest_unacked_seen = (tag, now)
                continue
            timeout = delivery_timeout(unacked[tag], default)
            if timeout and (now - seen[1]) * 1000 >= timeout:
                channel.oldest_unacked_seen = None
                channel.close_with_error(AMQPChannelError(
                    PRECONDITION_FAILED,
                    f"delivery acknowledgement on channel {channel.id} timed out. Timeout value used: "
                    f"{timeout} ms. Set consumer_timeout or x-consumer-timeout to change it"), None)
                closed += 1
    return closed
