"""RabbitMQ's sample query parameters on the API: ``lengths_age``/``lengths_incr`` add ``samples``
to the message counts' ``*_details``, ``msg_rates_age``/``msg_rates_incr`` to ``message_stats``'.

The samples come from the history the broker's stats sampler keeps (``broker.metrics.history``); without
the parameters a reply is unchanged and costs nothing more.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..broker.ops import FIELDS, Entry, StatsSampler, Window, length_details, rate_details
from .errors import bad_request


class SampleQuery:
    """The two windows a request asked for (either may be None)."""

    __slots__ = ("lengths", "rates", "now_ms")

    def __init__(self, query: Mapping[str, str]) -> None:
        try:
            self.lengths = Window.parse(query, "lengths")
            self.rates = Window.parse(query, "msg_rates")
        except ValueError as e:
            raise bad_request(str(e)) from None
        self.now_ms = int(time.time() * 1000)

    def __bool__(self) -> bool:
        return self.lengths is not None or self.rates is not None

    def apply(self, sampler: StatsSampler, entries: Sequence[Entry] | None, lengths_into: dict[str, Any] | None,
              stats: dict[str, Any] | None) -> None:
        """Add the samples of ``entries`` (one object's history) to its length details and its
        ``message_stats``; an object not sampled yet gets empty sample lists."""
        entries = entries or ()
        if self.lengths is not None and lengths_into is not None:
            length_details(lengths_into, self.lengths.points(sampler.times, entries, self.now_ms),
                           sampler.times, entries)
        if self.rates is not None and stats:
            rate_details(stats, self.rates.points(sampler.times, entries, self.now_ms), FIELDS)
