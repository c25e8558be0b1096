"""The longest name the model takes: 255 bytes of UTF-8, AMQP's short string.

Queue, exchange and vhost names and routing keys travel in AMQP as short strings, and the store writes
them as such; user, policy and parameter names are held to the same limit so that every object can be
named over every face. A longer name is refused where it enters (HTTP, a definitions import, a
shovel's settings) with PRECONDITION_FAILED, which the HTTP API answers as 400 ``bad_request``.
"""

from __future__ import annotations

from ..errors import PRECONDITION_FAILED, BrokerChannelError

MAX_NAME_BYTES = 255


def name_too_long(what: str, name: str) -> str | None:
    """Why ``name`` cannot be ``what`` (e.g. "queue name"), or None when it fits (and is valid UTF-8)."""
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate, e.g. "\\ud800" in a JSON body
        return f"{what} is not valid UTF-8: '{name[:40]!a}'"
    if size <= MAX_NAME_BYTES:
        return None
    return f"{what} is {size} bytes long, longer than the limit of {MAX_NAME_BYTES} bytes: '{name[:40]}...'"


def check_name_length(what: str, name: str) -> None:
    """406 PRECONDITION_FAILED when ``name`` is longer than 255 bytes of UTF-8."""
    reason = name_too_long(what, name)
    if reason is not None:
        raise BrokerChannelError(PRECONDITION_FAILED, reason)
