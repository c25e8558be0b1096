"""A read task's process keeps the memory it frees (lavinpy.spark.client.keep_freed_memory): a batch's
buffers, freed once Spark has the batch, are the next batch's without the kernel faulting and zeroing
their pages again. Measured in a fresh interpreter (glibc's adaptive defaults, untouched by this one)."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

# A 4 MB buffer used, freed and made again, as a reader's column and receive buffers are: the page
# faults of the second one (1,024 pages when its memory went back to the kernel in between).
_PROBE = """
import resource, sys
sys.path.insert(0, {root!r})
from lavinpy.spark.client import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
size = 4 << 20
first = bytearray(size)
first[::4096] = b"x" * (size // 4096)
del first
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
second = bytearray(size)
second[::4096] = b"y" * (size // 4096)
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _second_buffer_faults(how: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", _PROBE.format(root=str(REPO_ROOT)), how], check=True,
                         capture_output=True, text=True, timeout=60).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting is glibc's (mallopt)")
def test_freed_buffers_are_used_again_without_page_faults() -> None:
    kept, faults = _second_buffer_faults("keep")
    assert kept == "True"
    assert faults < 100, f"{faults} page faults for a buffer the process had just freed"
    _, adaptive = _second_buffer_faults("default")
    assert adaptive > 500, "glibc's defaults give the freed buffer back (what the setting is for)"
