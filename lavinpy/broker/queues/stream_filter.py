"""Stream filtering: which messages a stream consumer gets, from its ``x-stream-filter``,
``x-filter-match-type`` and ``x-stream-match-unfiltered`` arguments. Exact: a consumer receives every
message that matches and no other, so a client need not filter again (RabbitMQ's per-chunk Bloom
filter lets some others through).

- A publisher tags a message with the header ``x-stream-filter-value``: one value, or several
  separated by commas (LavinMQ's form).
- ``x-stream-filter`` is LavinMQ's string (comma-separated values), table (header name -> value: the
  message's header must hold that value, compared as text) or array of those; or RabbitMQ's string or
  array of strings. Each value and each header pair is one condition.
- ``x-filter-match-type``: ``all`` (LavinMQ's default) or ``any`` condition must hold. Without it, an
  array of strings only (RabbitMQ's form, where a message carries one value) matches any of them, as
  RabbitMQ does; every other form matches all.
- ``x-stream-match-unfiltered``: true also delivers the messages without ``x-stream-filter-value``.
- Without ``x-stream-filter`` a consumer gets every message.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

FILTER = "x-stream-filter"
MATCH_TYPE = "x-filter-match-type"
MATCH_UNFILTERED = "x-stream-match-unfiltered"
VALUE_HEADER = "x-stream-filter-value"


class StreamFilterError(ValueError):
    """A consumer's filter arguments are malformed; the text is the reply's."""


@dataclass(frozen=True, slots=True)
class StreamFilter:
    values: frozenset[str]  # each must be among the message's x-stream-filter-value values
    headers: tuple[tuple[str, str], ...]  # (name, value as text): the message's header must be that
    match_all: bool
    match_unfiltered: bool

    def matches(self, headers: Mapping[str, Any] | None) -> bool:
        """Whether a message with these headers goes to the consumer."""
        tagged = headers is not None and VALUE_HEADER in headers
        if self.match_unfiltered and not tagged:
            return True
        if headers is None:
            return False
        held = message_values(headers.get(VALUE_HEADER)) if tagged else frozenset()
        results = (value in held for value in self.values)
        pairs = (name in headers and as_text(headers[name]) == value for name, value in self.headers)
        if self.match_all:
            return all(results) and all(pairs)
        return any(results) or any(pairs)


def as_text(value: Any) -> str:
    """A header value as text, for comparing with a filter's (AMQP booleans as true/false)."""
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):  # the decoder's typed integers (Int8...) print their type with str()
        return int.__repr__(value)
    if isinstance(value, float):
        return float.__repr__(value)
    if isinstance(value, datetime.datetime | decimal.Decimal | str):
        return str(value)
    return repr(value)


def message_values(value: Any) -> frozenset[str]:
    """The filter values a message's ``x-stream-filter-value`` holds (comma-separated, trimmed)."""
    if value is None:
        return frozenset()
    return frozenset(part.strip() for part in as_text(value).split(",") if part.strip())


def stream_filter(arguments: Mapping[str, Any] | None) -> StreamFilter | None:
    """The consumer's filter (None: every message); StreamFilterError for malformed arguments."""
    arguments = arguments or {}
    raw = arguments.get(FILTER)
    match_type = arguments.get(MATCH_TYPE)
    unfiltered = arguments.get(MATCH_UNFILTERED, False)
    if not isinstance(unfiltered, bool):
        raise StreamFilterError(f"{MATCH_UNFILTERED} must be a boolean")
    if match_type is not None:
        text = as_text(match_type).lower() if isinstance(match_type, str | bytes) else None
        if text not in ("all", "any"):
            raise StreamFilterError(f"{MATCH_TYPE} must be 'any' or 'all'")
    if raw is None:
        return None
    values: set[str] = set()
    headers: list[tuple[str, str]] = []
    _collect(raw, values, headers, top=True)
    if match_type is None:  # RabbitMQ's array of values: any of them (a message carries one)
        match_all = not (isinstance(raw, list | tuple) and all(isinstance(v, str | bytes) for v in raw))
    else:
        match_all = as_text(match_type).lower() == "all"
    if not values and not headers:
        return None
    return StreamFilter(frozenset(values), tuple(headers), match_all, unfiltered)


def _collect(raw: Any, values: set[str], headers: list[tuple[str, str]], *, top: bool) -> None:
    if isinstance(raw, str | bytes):
        values.update(message_values(raw))
    elif isinstance(raw, Mapping):
        for name, value in raw.items():
            if name == FILTER:
                values.update(message_values(value))
            else:
                headers.append((str(name), as_text(value)))
    elif isinstance(raw, list | tuple) and top:
        for item in raw:
            _collect(item, values, headers, top=False)
    else:
        raise StreamFilterError(f"{FILTER} must be a string, table, or array")
