"""One switch selects the codec path: LAVINPY_PURE_PYTHON=1 forces pure Python everywhere, otherwise the
compiled extension runs (CI builds it; this test fails a run that meant to be compiled and was not)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from lavinpy.wire import accel, reader, writer

REPO = Path(__file__).resolve().parents[2]


def test_selected_path_matches_the_variable() -> None:
    pure = os.environ.get("LAVINPY_PURE_PYTHON") == "1"
    assert accel.PURE_PYTHON_REQUESTED is pure
    assert accel.COMPILED is not pure
    assert (accel.cwire is None) is pure
    assert (accel.csocket is None) is pure
    assert (writer._deliver_frames is writer.deliver_frames_py) is pure
    assert reader.FrameReader()._compiled is not pure


def test_the_variable_switches_every_user_in_a_fresh_interpreter() -> None:
    code = ("from lavinpy.wire import accel, client, reader, writer; "
            "print(accel.COMPILED, accel.load('lavinpy.wire._cwire') is None, reader.FrameReader()._compiled, "
            "writer._ack_frame is writer.ack_frame_py, accel.csocket)")
    env = dict(os.environ, PYTHONPATH=str(REPO), LAVINPY_PURE_PYTHON="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", "False", "True", "None"]
