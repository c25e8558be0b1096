"""The broker sets glibc's malloc thresholds at start (server.tune_malloc): refused settings would leave
the delivery runs' buffers mapped and faulted in afresh each time (see MALLOC_MMAP_THRESHOLD)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's thresholds are glibc's")
def test_glibc_takes_the_thresholds() -> None:
    code = "from lavinpy.server import tune_malloc; print(tune_malloc())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"
