"""Resource alarms: free disk space and the broker's memory (RSS) against their configured limits.

The memory limit comes from ``config.parse_watermark``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def process_rss() -> int:
    """This process's resident set size in bytes (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return 0


def disk_free(path: Path) -> int | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def alarm_reason(data_dir: Path, disk_free_limit: int, memory_limit: int) -> str | None:
    """Why publishers must be blocked now, or None."""
    reasons = []
    free = disk_free(data_dir)
    if free is not None and free < disk_free_limit:
        reasons.append(f"low on disk: {free} bytes free, limit {disk_free_limit}")
    rss = process_rss()
    if memory_limit and rss > memory_limit:
        reasons.append(f"memory: {rss} bytes used, high watermark {memory_limit}")
    return "; ".join(reasons) or None
