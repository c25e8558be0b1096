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


_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
               "t": 1000**4, "tb": 1000**4, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}


def parse_size(value: str | int | float) -> int:
    """A byte count as rabbitmqctl takes it: 50000000, "50MB", "2GiB", "1G". ValueError otherwise."""
    text = str(value).strip()
    number = text.rstrip("KMGTkmgtiIBb")
    unit = text[len(number):].strip().lower()
    if unit not in _SIZE_UNITS:
        raise ValueError(f"not a size: {text!r}")
    try:
        amount = float(number)
    except ValueError:
        raise ValueError(f"not a size: {text!r}") from None
    if amount < 0:
        raise ValueError(f"a size cannot be negative: {text!r}")
    return int(amount * _SIZE_UNITS[unit])


def memory_watermark(*, fraction: float | str | None = None, absolute: str | int | None = None) -> str:
    """The ``memory_high_watermark`` setting for rabbitmqctl's two forms: a fraction of RAM (0 to 1)
    or ``absolute`` bytes (the setting's "<n>B", so a small absolute figure is never read as a fraction)."""
    if (fraction is None) == (absolute is None):
        raise ValueError("give either a fraction of RAM or an absolute size")
    if fraction is not None:
        share = float(fraction)
        if not 0 <= share <= 1:
            raise ValueError(f"the fraction of RAM must be between 0 and 1, not {fraction!r}")
        return repr(share)
    return f"{parse_size(absolute if absolute is not None else 0)}B"


def disk_limit(*, size: str | int | None = None, mem_relative: float | str | None = None,
               total_memory: int = 0) -> int:
    """``disk_free_limit`` in bytes from rabbitmqctl's two forms: a size, or ``mem_relative`` (a multiple
    of the machine's RAM)."""
    if (size is None) == (mem_relative is None):
        raise ValueError("give either a size or mem_relative")
    if size is not None:
        return parse_size(size)
    factor = float(mem_relative if mem_relative is not None else 0)
    if factor < 0:
        raise ValueError(f"mem_relative cannot be negative, not {mem_relative!r}")
    return int(factor * total_memory)
