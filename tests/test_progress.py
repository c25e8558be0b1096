"""lavinpy.progress: a bar on a terminal, a line per 10 % elsewhere, nothing for small work."""

from __future__ import annotations

import io
import logging

import pytest

from lavinpy.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_line_per_ten_percent_when_not_a_terminal() -> None:
    out = io.StringIO()
    with Progress("copying", 1000, unit="rows", stream=out) as progress:
        for _ in range(250):
            progress.advance(4)
    lines = out.getvalue().splitlines()
    assert lines == [f"copying: {p}% ({p * 10:,} of 1,000 rows)" for p in range(10, 101, 10)]


def test_big_steps_skip_lines_and_the_end_is_said_once() -> None:
    out = io.StringIO()
    with Progress("x", 10, stream=out) as progress:
        progress.update(7)
    assert out.getvalue().splitlines() == ["x: 70% (7 of 10)", "x: 100% (10 of 10)"]


def test_a_bar_redrawn_in_place_on_a_terminal() -> None:
    out = Terminal()
    with Progress("loading", 200, unit="bytes", stream=out) as progress:
        progress.advance(100)
        progress.advance(100)
    text = out.getvalue()
    assert text.startswith("\rloading [") and text.endswith("] 100% 200 of 200 bytes\n")
    assert "\n" not in text[:-1], "one line, redrawn with carriage returns"
    assert "#" * 30 in text


def test_small_work_reports_nothing() -> None:
    out = Terminal()
    with Progress("tiny", 10, stream=out, min_total=1000) as progress:
        progress.advance(10)
    assert out.getvalue() == ""


def test_through_a_logger(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("lavinpy.test_progress")
    caplog.set_level(logging.INFO, logger=log.name)
    with Progress("recovering", 4, unit="entries", log=log) as progress:
        for _ in range(4):
            progress.advance(1)
    assert [r.getMessage() for r in caplog.records] == [
        "recovering: 25% (1 of 4 entries)", "recovering: 50% (2 of 4 entries)", "recovering: 75% (3 of 4 entries)",
        "recovering: 100% (4 of 4 entries)"]


def test_a_failure_ends_the_bar_line_without_claiming_the_end() -> None:
    out = Terminal()
    with pytest.raises(RuntimeError), Progress("job", 10, stream=out) as progress:
        progress.advance(5)
        raise RuntimeError("stop")
    assert "100%" not in out.getvalue() and out.getvalue().endswith("\n")
