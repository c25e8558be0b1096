"""Progress of long work: a bar redrawn in place on a terminal, a line per 10 % anywhere else (a log
file, a pipe, the broker's logger), so that nobody stares at a silent command for minutes.

    with Progress("importing definitions", total=len(data), unit="bytes") as progress:
        for chunk in chunks:
            send(chunk)
            progress.advance(len(chunk))
"""

from __future__ import annotations

import logging
import sys
import time
from typing import IO, Self

_BAR_WIDTH = 30
_REDRAW_S = 0.1  # a terminal bar is redrawn at most this often


class Progress:
    """Reports ``done`` of ``total``: on a terminal ``stream``, a bar; otherwise (or through ``log``) a
    line at each further 10 %. Work smaller than ``min_total`` reports nothing."""

    def __init__(self, what: str, total: int, *, unit: str = "", stream: IO[str] | None = None,
                 log: logging.Logger | None = None, min_total: int = 1) -> None:
        self.what = what
        self.total = max(0, total)
        self.unit = unit
        self.log = log
        self.stream = stream if stream is not None or log is not None else sys.stderr
        self.done = 0
        self.quiet = self.total < max(1, min_total)
        self.tty = log is None and self.stream is not None and _isatty(self.stream)
        self._tenths = 0  # the last 10 % step reported
        self._drawn_at = 0.0

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.finish()
        elif self.tty and not self.quiet:
            self._write("\n")

    def advance(self, n: int) -> None:
        self.update(self.done + n)

    def update(self, done: int) -> None:
        self.done = min(done, self.total) if self.total else done
        if self.quiet or not self.total:
            return
        if self.tty:
            now = time.monotonic()
            if now - self._drawn_at >= _REDRAW_S or self.done == self.total:
                self._drawn_at = now
                self._write("\r" + self.bar())
            return
        tenths = self.done * 10 // self.total
        if tenths > self._tenths:
            self._tenths = tenths
            self._line(self.line())

    def finish(self) -> None:
        """Report the end (100 %), once."""
        if self.quiet:
            return
        if self.tty:
            self.update(self.total)
            self._write("\r" + self.bar() + "\n")
        elif self._tenths < 10:
            self._tenths = 10
            self.done = self.total
            self._line(self.line())

    def _amount(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        return f"{self.done:,} of {self.total:,}{unit}"

    def percent(self) -> int:
        return 100 if not self.total else self.done * 100 // self.total

    def bar(self) -> str:
        filled = _BAR_WIDTH * self.percent() // 100
        return f"{self.what} [{'#' * filled}{' ' * (_BAR_WIDTH - filled)}] {self.percent():3d}% {self._amount()}"

    def line(self) -> str:
        return f"{self.what}: {self.percent()}% ({self._amount()})"

    def _line(self, text: str) -> None:
        if self.log is not None:
            self.log.info("%s", text)
        else:
            self._write(text + "\n")

    def _write(self, text: str) -> None:
        if self.stream is not None:
            self.stream.write(text)
            self.stream.flush()


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
