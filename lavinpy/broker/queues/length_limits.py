"""Queue length limits (x-max-length, x-max-length-bytes): what counts, and when a queue is full.

As in RabbitMQ, only ready messages count (not unacked ones), and bytes are body bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ..settings.arguments import QueueSettings


def over_limit(settings: QueueSettings, ready: int, ready_bytes: int) -> bool:
    """More ready messages (or bytes) than the queue may hold: drop-head removes from the head."""
    max_len, max_bytes = settings.max_length, settings.max_length_bytes
    return (max_len is not None and ready > max_len) or (max_bytes is not None and ready_bytes > max_bytes)


def would_overflow(settings: QueueSettings, ready: int, ready_bytes: int, size: int) -> bool:
    """Whether one more message of ``size`` body bytes would exceed a limit (reject-publish modes)."""
    max_len, max_bytes = settings.max_length, settings.max_length_bytes
    return (max_len is not None and ready + 1 > max_len) or \
        (max_bytes is not None and ready_bytes + size > max_bytes)


def body_bytes(positions: Iterable[int], body_size: Callable[[int], int]) -> int:
    """Sum of the body sizes of ``positions`` (rebuilding the byte counter when a queue opens)."""
    return sum(body_size(pos) for pos in positions)
