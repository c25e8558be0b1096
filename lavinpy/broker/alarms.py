"""Resource alarms: free disk space and the broker's memory (RSS) against their configured limits.

``memory_high_watermark`` is either a fraction of the machine's RAM ("0.4", as RabbitMQ's
vm_memory_high_watermark) or an absolute size ("512MiB", "200MB", "1073741824").
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B|[kmgt]i?b|B|b)?\s*")
_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
          "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def total_memory() -> int:
    """Physical RAM in bytes."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def parse_watermark(value: str | float | int, total: int | None = None) -> int:
    """The memory limit in bytes; ValueError when the value is neither a fraction nor a size."""
    text = str(value).strip()
    match = _SIZE.fullmatch(text)
    if match is None:
        raise ValueError(f"memory_high_watermark must be a fraction of RAM (0.4) or a size (512MiB), not {text!r}")
    number, unit = float(match.group(1)), (match.group(2) or "").lower()
    if not unit and number <= 1.0:  # a fraction of RAM (1 means all of it)
        return int(number * (total_memory() if total is None else total))
    return int(number * _UNITS[unit])


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
