"""Rate-limited logging of client errors: one line each, a bounded number per interval (the limiter
itself, ``RateLimitedLog``, is shared with the other faces in ``lavinpy.logs``)."""

from __future__ import annotations

import logging

from ..logs import RateLimitedLog

__all__ = ["RateLimitedLog", "channel_close_log", "proxy_header_log", "log_bad_proxy_header"]


# Channel closes are client errors: one line each, rate-limited, under the channel's logger.
channel_close_log = RateLimitedLog(logging.getLogger("lavinpy.channel"))

# PROXY headers refused (from an untrusted peer, malformed, or missing from a trusted one): bad input,
# one line per connection, rate-limited as a flood of them would be.
proxy_header_log = RateLimitedLog(logging.getLogger("lavinpy.proxy"))


def log_bad_proxy_header(what: str, peer: object, reason: str) -> None:
    host = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "?"
    proxy_header_log.log(logging.WARNING, "%s connection from %s closed: %s", what, host, reason)
