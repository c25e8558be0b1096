"""Atomic small-file writes (JSON and raw bytes) and JSON reads, and the two low-level writes the store
and replication share (``fsync_dir``, ``pwrite_all``).

A file is replaced by writing ``<file>.tmp``, fsyncing it, renaming it over the target and fsyncing the
directory, so a crash leaves either the old or the new content, never a torn mix.
"""

from __future__ import annotations

import errno
import json
import os
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lavinpy.store import changes

# Data dir files hold password hashes and message bodies: owner only, whatever the process umask.
FILE_MODE = 0o600
DIR_MODE = 0o700


def pwrite_all(fd: int, pieces: Sequence[bytes | memoryview], offset: int) -> None:
    """Write ``pieces`` one after the other at ``offset`` (several in one ``pwritev``), until complete:
    at ENOSPC ext4 and tmpfs write part of a buffer, and only the next call reports the error."""
    if len(pieces) == 1:
        rest = memoryview(pieces[0])
    else:
        done = os.pwritev(fd, pieces, offset)
        if done == sum(map(len, pieces)):
            return
        rest = memoryview(b"".join(pieces))[done:]
        offset += done
    while rest:
        written = os.pwrite(fd, rest, offset)
        if written <= 0:
            raise OSError(errno.EIO, "pwrite made no progress")
        offset += written
        rest = rest[written:]


def fsync_dir(path: Path) -> None:
    """Make a rename or a new/removed entry in directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tmp_path_for(path: Path) -> Path:
    """The sibling temporary file used while ``path`` is being replaced."""
    return path.with_name(path.name + ".tmp")


def write_bytes_atomic(path: Path, data: bytes | memoryview | array) -> None:
    """Replace ``path`` with ``data`` (any bytes-like object) atomically and durably."""
    path = Path(path)
    tmp = tmp_path_for(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), FILE_MODE)
    with open(fd, "wb") as f:
        os.fchmod(fd, FILE_MODE)  # a leftover .tmp keeps its old mode through O_CREAT
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
    changes.replaced(path, data)


def write_json_atomic(path: Path, obj: Any) -> None:
    """Serialise ``obj`` as JSON (UTF-8, indented for humans) and replace ``path`` atomically."""
    text = json.dumps(obj, indent=2, ensure_ascii=False) + "\n"
    write_bytes_atomic(Path(path), text.encode("utf-8"))


def read_json(path: Path, default: Any) -> Any:
    """Load JSON from ``path``; a missing file gives ``default``, a corrupt one a ValueError naming it."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return default
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from exc
