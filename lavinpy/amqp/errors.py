"""Protocol errors carrying an AMQP reply code and the text sent in connection.close / channel.close."""

from __future__ import annotations

import logging
import time

from lavinpy.amqp.constants import REPLY_NAMES

# reply-text is a shortstr on the wire: at most 255 bytes of UTF-8.
_SHORTSTR_MAX = 255


def _fit_shortstr(text: str) -> str:
    # Names decoded from a client's non-UTF-8 bytes hold surrogates: show them escaped.
    encoded = text.encode("utf-8", "backslashreplace")
    if len(encoded) <= _SHORTSTR_MAX:
        return encoded.decode("utf-8")
    # Cut on a byte boundary; "ignore" drops a multi-byte character split at the end.
    return encoded[:_SHORTSTR_MAX].decode("utf-8", "ignore")


class AMQPError(Exception):
    """A protocol error: ``code`` and ``text`` go into the close method, with the offending method's ids.

    ``text`` starts with the reply code's name, the way RabbitMQ writes it
    ("NOT_FOUND - no queue 'x' in vhost '/'"), and is cut to 255 UTF-8 bytes so it always encodes.
    ``frames`` holds the frames a ``FrameReader.feed`` call decoded before it met the error.
    """

    def __init__(self, code: int, detail: str, class_id: int = 0, method_id: int = 0) -> None:
        self.code = code
        self.detail = detail
        self.text = _fit_shortstr(f"{REPLY_NAMES.get(code, 'UNKNOWN')} - {detail}")
        self.class_id = class_id
        self.method_id = method_id
        # Set by FrameReader.feed: frames decoded from the same input before the error.
        self.frames: list = []
        super().__init__(self.text)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code}, {self.text!r}, {self.class_id}, {self.method_id})"


class AMQPConnectionError(AMQPError):
    """A hard error: the server sends connection.close and closes the connection."""


class AMQPChannelError(AMQPError):
    """A soft error: the server sends channel.close; the connection and its other channels go on."""


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
