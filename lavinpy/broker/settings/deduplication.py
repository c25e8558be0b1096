"""Message deduplication's arguments, in LavinMQ's form (settings wing, a value module).

On an exchange (a duplicate is routed nowhere) or a queue (a duplicate routed there is not stored):

- ``x-message-deduplication`` (bool, default false): turns it on;
- ``x-cache-size`` (int, LavinMQ's default 128): how many identifiers are remembered; the oldest goes
  first when it is full;
- ``x-cache-ttl`` (int ms, default none): how long an identifier is remembered; a message's own
  ``x-cache-ttl`` header overrides it for its identifier;
- ``x-deduplication-header`` (string, default ``x-deduplication-header``): the message header that
  holds the identifier. A message without it is never a duplicate and is not remembered.

lavinpy keeps the identifiers on disk and replicated (``dedup_cache``), so a restart, a kill -9 or a
failover does not forget them; LavinMQ keeps them in memory. Values lavinpy bounds: a cache of at
most ``MAX_CACHE_SIZE`` entries, identifiers longer than ``MAX_KEY_BYTES`` remembered by their SHA-256.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ENABLE = "x-message-deduplication"
CACHE_SIZE = "x-cache-size"
CACHE_TTL = "x-cache-ttl"
HEADER = "x-deduplication-header"
ARGUMENTS = (ENABLE, CACHE_SIZE, CACHE_TTL, HEADER)
DEFAULT_CACHE_SIZE = 128  # LavinMQ's
DEFAULT_HEADER = "x-deduplication-header"  # LavinMQ's: the header's name is also the argument's
MAX_CACHE_SIZE = 10_000_000
MAX_TTL = 315_360_000_000  # ten years in ms, RabbitMQ's TTL ceiling
MAX_KEY_BYTES = 64


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return value if isinstance(value, str) else None


def argument_problem(arguments: Mapping[str, Any]) -> tuple[str, str] | None:
    """The first bad deduplication argument: (its name, the reason term), or None."""
    if ENABLE in arguments and not isinstance(arguments[ENABLE], bool):
        return ENABLE, "{unacceptable_type,not_a_boolean}"
    if CACHE_SIZE in arguments:
        size = arguments[CACHE_SIZE]
        if not _is_int(size):
            return CACHE_SIZE, "{unacceptable_type,not_an_integer}"
        if not 1 <= size <= MAX_CACHE_SIZE:
            return CACHE_SIZE, f"{{out_of_range,{size}}}"
    if CACHE_TTL in arguments:
        ttl = arguments[CACHE_TTL]
        if not _is_int(ttl):
            return CACHE_TTL, "{unacceptable_type,not_an_integer}"
        if not 0 <= ttl <= MAX_TTL:
            return CACHE_TTL, f"{{out_of_range,{ttl}}}"
    if HEADER in arguments:
        header = _text(arguments[HEADER])
        if header is None:
            return HEADER, "{unacceptable_type,not_a_string}"
        if not header or len(header.encode()) > 255:
            return HEADER, "{invalid_length,must_be_1_to_255_bytes}"
    return None


@dataclass(frozen=True, slots=True)
class DedupSettings:
    cache_size: int = DEFAULT_CACHE_SIZE
    ttl_ms: int | None = None
    header: str = DEFAULT_HEADER


def settings_of(arguments: Mapping[str, Any] | None) -> DedupSettings | None:
    """The deduplication an exchange's or queue's (validated) arguments ask for, or None."""
    if not arguments or arguments.get(ENABLE) is not True:
        return None
    size, ttl = arguments.get(CACHE_SIZE), arguments.get(CACHE_TTL)
    header = _text(arguments.get(HEADER))
    return DedupSettings(size if isinstance(size, int) and size > 0 else DEFAULT_CACHE_SIZE,
                         ttl if isinstance(ttl, int) and ttl >= 0 else None, header or DEFAULT_HEADER)
