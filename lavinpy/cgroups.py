"""The memory limit of this process's own cgroup (a container's or a systemd unit's cap), if any.

A fractional ``memory_high_watermark`` is taken of this limit rather than of the host's RAM: in a
container capped below the host's RAM the kernel's OOM killer would otherwise strike before the
alarm fires. Standard library only; every path is read under ``root`` so tests can point it at a
fake tree.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

# cgroup v1 reports "no limit" as a huge page-aligned number (PAGE_COUNTER_MAX); anything this
# large is no real cap.
_V1_UNLIMITED = 1 << 62


def _mounts(root: Path) -> tuple[list[tuple[str, Path]], list[tuple[str, Path]]]:
    """(cgroup v2 mounts, cgroup v1 memory mounts) as (root inside the hierarchy, mount point)."""
    v2: list[tuple[str, Path]] = []
    v1: list[tuple[str, Path]] = []
    try:
        lines = (root / "proc/self/mountinfo").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        # "36 35 0:30 / /sys/fs/cgroup/memory rw,relatime shared:1 - cgroup cgroup rw,memory":
        # the optional fields end at " - ", after which come the type, source and options.
        head, sep, tail = line.partition(" - ")
        fields, after = head.split(), tail.split()
        if not sep or len(fields) < 5 or len(after) < 3:
            continue
        mount_root, mount_point = fields[3], root / fields[4].lstrip("/")
        if after[0] == "cgroup2":
            v2.append((mount_root, mount_point))
        elif after[0] == "cgroup" and "memory" in after[2].split(","):
            v1.append((mount_root, mount_point))
    if not lines:  # no mountinfo: the usual places
        v2 = [("/", root / "sys/fs/cgroup")]
        v1 = [("/", root / "sys/fs/cgroup/memory")]
    return v2, v1


def _own_paths(root: Path) -> tuple[str | None, str | None]:
    """This process's (cgroup v2 path, cgroup v1 memory path) from /proc/self/cgroup."""
    v2 = v1 = None
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v2, v1


def _directories(mount_root: str, mount_point: Path, path: str) -> list[Path]:
    """The cgroup's directory and its ancestors' up to the mount point: a parent's cap binds too
    (a unit in a capped slice, a process in a child of a capped container)."""
    rel = path
    if mount_root != "/" and (path == mount_root or path.startswith(mount_root + "/")):
        rel = path[len(mount_root):]
    parts = [p for p in rel.split("/") if p]
    dirs = [mount_point.joinpath(*parts[:i]) for i in range(len(parts), 0, -1)]
    # Without a cgroup namespace the path names the host's hierarchy while the container sees
    # only its own cgroup at the mount point: that one is read as well.
    dirs.append(mount_point)
    return dirs


def _read_limit(file: Path) -> int | None:
    try:
        text = file.read_text().strip()
    except OSError:
        return None
    if text in ("", "max"):
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return value if 0 < value < _V1_UNLIMITED else None


@functools.lru_cache(maxsize=8)
def _limit_files(root: str) -> tuple[Path, ...]:
    """Every file that may hold a cap on this process. Found once: the alarm check runs every few
    seconds and after every 16 MiB of input, and mountinfo can be long on a container host; a broker
    is not moved to another cgroup while it runs, while a cap may be changed (docker update), so the
    files themselves are read on every call."""
    base = Path(root)
    v2_path, v1_path = _own_paths(base)
    v2_mounts, v1_mounts = _mounts(base)
    files: list[Path] = []
    for path, mounts, name in ((v2_path, v2_mounts, "memory.max"), (v1_path, v1_mounts, "memory.limit_in_bytes")):
        if path is None:
            continue
        for mount_root, mount_point in mounts:
            files += [directory / name for directory in _directories(mount_root, mount_point, path)]
    return tuple(files)


def cgroup_memory_limit(root: str | os.PathLike[str] = "/") -> int | None:
    """The tightest memory cap on this process's cgroup and its ancestors in bytes; None = no cap.

    cgroup v2 ``memory.max`` and v1 ``memory.limit_in_bytes``; "max" or a missing file is no cap.
    """
    limits = [limit for file in _limit_files(os.fspath(root)) if (limit := _read_limit(file)) is not None]
    return min(limits) if limits else None
