"""Rate-limited logging of client errors: one line each, a bounded number per interval."""

from __future__ import annotations

import logging
import time


class RateLimitedLog:
    """Logs at most ``burst`` lines per ``interval`` seconds; the next line allowed says how many were
    dropped. One misbehaving client (or a thousand) cannot fill the disk with the same complaint."""

    def __init__(self, logger: logging.Logger, burst: int = 20, interval: float = 10.0) -> None:
        self.logger = logger
        self.burst = burst
        self.interval = interval
        self._window_start = 0.0
        self._count = 0
        self.suppressed = 0

    def allow(self) -> bool:
        """True when a line may be written now (and counts it); False counts it as suppressed."""
        now = time.monotonic()
        if now - self._window_start >= self.interval:
            self._window_start = now
            self._count = 0
        if self._count >= self.burst:
            self.suppressed += 1
            return False
        self._count += 1
        if self.suppressed:
            self.logger.warning("%d similar log lines suppressed in the last %.0f s", self.suppressed,
                                self.interval)
            self.suppressed = 0
        return True

    def log(self, level: int, msg: str, *args: object) -> None:
        """``logger.log(level, msg, *args)`` unless over the limit. One line: no traceback."""
        if self.allow():
            self.logger.log(level, msg, *args)


# Channel closes are client errors: one line each, rate-limited, under the channel's logger.
channel_close_log = RateLimitedLog(logging.getLogger("lavinpy.channel"))

# PROXY headers refused (from an untrusted peer, malformed, or missing from a trusted one): bad input,
# one line per connection, rate-limited as a flood of them would be.
proxy_header_log = RateLimitedLog(logging.getLogger("lavinpy.proxy"))


def log_bad_proxy_header(what: str, peer: object, reason: str) -> None:
    host = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "?"
    proxy_header_log.log(logging.WARNING, "%s connection from %s closed: %s", what, host, reason)
