"""Log output: text or JSON lines, on stderr or appended to a file that SIGUSR1 reopens.

Operators rotate broker logs with logrotate as they do RabbitMQ's and LavinMQ's: the file is renamed,
then the broker is told to reopen its path, so no line is lost and none goes to the renamed file
after the signal. JSON output is one object per line for log shippers that must not parse text.
"""

from __future__ import annotations

import io
import json
import logging
import sys
import time
from typing import Any, cast

_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JSONFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601 with ms), level, logger, message, and
    exception (the traceback text) only when the record carries one."""

    def format(self, record: logging.LogRecord) -> str:
        seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        entry: dict[str, Any] = {
            "time": f"{seconds}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        # ensure_ascii: a message carrying a client's bytes cannot break the line or the encoding.
        return json.dumps(entry, ensure_ascii=True)


class ReopenableFileHandler(logging.FileHandler):
    """Appends to ``path``; ``reopen()`` closes the file and opens the path again (after logrotate)."""

    def __init__(self, path: str) -> None:
        super().__init__(path, mode="a", encoding="utf-8", delay=False)

    def reopen(self) -> None:
        # Under the handler's lock: a record being written finishes in the old file first.
        self.acquire()
        try:
            if self.stream is not None and self.stream is not sys.stderr:  # stderr: a failed reopen's stand-in
                self.stream.flush()
                self.stream.close()
            self.stream = self._open()
        finally:
            self.release()


_file_handler: ReopenableFileHandler | None = None


def configure_logging(level: str, fmt: str = "text", file: str = "") -> None:
    """Send the root logger's records to ``file`` (appended) or stderr, as text or JSON lines.

    OSError when the file cannot be opened: the caller reports it before anything else starts.
    """
    global _file_handler
    handler: logging.Handler
    if file:
        handler = _file_handler = ReopenableFileHandler(file)
    else:
        handler = logging.StreamHandler(sys.stderr)
        _file_handler = None
    handler.setFormatter(JSONFormatter() if fmt == "json" else logging.Formatter(_TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level.upper())


def reopen_log_file() -> None:
    """SIGUSR1: reopen the log file (nothing to do when logging to stderr)."""
    handler = _file_handler
    if handler is None:
        return
    try:
        handler.reopen()
    except OSError as e:
        # The old stream is closed; records go to stderr until a later SIGUSR1 succeeds.
        handler.stream = cast(io.TextIOWrapper, sys.stderr)  # a text stream, as the file was
        print(f"lavinpy: cannot reopen log file {handler.baseFilename}: {e}", file=sys.stderr)
        return
    logging.getLogger("lavinpy").info("log file reopened (SIGUSR1)")


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
