"""log_format (text | json) and log_file, which SIGUSR1 reopens after logrotate renamed it."""

from __future__ import annotations

import io
import json
import logging
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lavinpy import config
from lavinpy.logs import JSONFormatter

from .broker_proc import broker_env, port_args, start, stop, wait_for


def json_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_json_log_file_is_reopened_on_sigusr1(tmp_path: Path):
    log_file = tmp_path / "lavinpy.log"
    log_file.write_text('{"earlier": true}\n')  # appended to, not truncated
    env = broker_env({"LAVINPY_LOG_FORMAT": "json", "LAVINPY_LOG_FILE": str(log_file)})
    proc = start(port_args(tmp_path), tmp_path, env)
    try:
        wait_for(lambda: "lavinpy started" in log_file.read_text(), proc, "the started line in the log file")
        lines = json_lines(log_file)
        assert lines[0] == {"earlier": True}
        for entry in lines[1:]:
            assert set(entry) >= {"time", "level", "logger", "message"}, entry
            assert entry["time"].endswith("Z") and entry["level"] in ("debug", "info", "warning", "error")
        started = [e for e in lines[1:] if e["message"].startswith("lavinpy started")]
        assert started and started[0]["logger"] == "lavinpy" and started[0]["level"] == "info"
        # logrotate: rename, then SIGUSR1; the broker writes to a new file at the old path.
        rotated = tmp_path / "lavinpy.log.1"
        log_file.rename(rotated)
        proc.send_signal(signal.SIGUSR1)
        wait_for(lambda: log_file.exists() and "log file reopened" in log_file.read_text(), proc,
                 "the reopened log file")
    finally:
        rc = stop(proc)
    assert rc == 0
    assert (tmp_path / "stderr").read_text() == ""  # nothing on stderr when a log file is set
    old = [e.get("message") for e in json_lines(rotated)]
    new = [e["message"] for e in json_lines(log_file)]
    assert "stopped" not in old and "log file reopened (SIGUSR1)" not in old, old
    assert new[0] == "log file reopened (SIGUSR1)" and new[-1] == "stopped", new


def test_text_log_file_from_flags(tmp_path: Path):
    log_file = tmp_path / "text.log"
    proc = start([*port_args(tmp_path), "--log-format", "text", "--log-file", str(log_file)], tmp_path)
    try:
        wait_for(lambda: log_file.exists() and "lavinpy started" in log_file.read_text(), proc, "the started line")
    finally:
        assert stop(proc) == 0
    lines = log_file.read_text().splitlines()
    assert any(" INFO lavinpy: lavinpy started" in line for line in lines), lines
    assert not lines[0].startswith("{")


def test_an_unwritable_log_file_stops_the_start(tmp_path: Path):
    proc = subprocess.run([sys.executable, "-m", "lavinpy", *port_args(tmp_path),
                           "--log-file", str(tmp_path / "no" / "such" / "dir.log")],
                          cwd=tmp_path, env=broker_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "cannot open log file" in proc.stderr
    assert not (tmp_path / "data").exists()


def test_json_record_carries_the_exception():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JSONFormatter())
    logger = logging.getLogger("lavinpy.test.json")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        try:
            raise ValueError("bad\nvalue \u00e9")
        except ValueError:
            logger.exception("failed on %s", "input\nwith a newline")
        logger.warning("plain")
    finally:
        logger.removeHandler(handler)
    first, second = stream.getvalue().splitlines()  # one line each, newlines escaped
    entry = json.loads(first)
    assert entry["message"] == "failed on input\nwith a newline" and entry["level"] == "error"
    assert entry["logger"] == "lavinpy.test.json"
    assert "Traceback" in entry["exception"] and "ValueError: bad\nvalue \u00e9" in entry["exception"]
    assert "exception" not in json.loads(second)


def test_log_settings_from_environment_and_a_bad_format_refused(tmp_path: Path):
    cfg = config.load(None, env={"LAVINPY_LOG_FORMAT": "json", "LAVINPY_LOG_FILE": "/var/log/lavinpy/x.log"})
    assert (cfg.log_format, cfg.log_file) == ("json", "/var/log/lavinpy/x.log")
    assert (config.Config().log_format, config.Config().log_file) == ("text", "")
    with pytest.raises(config.ConfigError, match="log_format must be one of text, json, not 'xml'"):
        config.load(None, env={"LAVINPY_LOG_FORMAT": "xml"})
    proc = subprocess.run([sys.executable, "-m", "lavinpy", *port_args(tmp_path), "--log-format", "xml"],
                          cwd=tmp_path, env=broker_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--log-format" in proc.stderr
