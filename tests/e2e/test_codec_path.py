"""The broker runs the codec path LAVINPY_PURE_PYTHON selects, and says so at startup (CI runs the whole
suite once each way; this test proves which one a run exercised)."""

from __future__ import annotations

import os

from lavinpy.wire import accel

from .conftest import lavinpy_only


@lavinpy_only()
def test_broker_logs_the_selected_codec_path(broker) -> None:
    pure = os.environ.get("LAVINPY_PURE_PYTHON") == "1"
    assert accel.COMPILED is not pure
    started = [line for line in broker.log.splitlines() if "lavinpy started" in line]
    assert started, broker.log[-2000:]
    assert started[-1].endswith("pure-Python codec)" if pure else "compiled codec)"), started[-1]
