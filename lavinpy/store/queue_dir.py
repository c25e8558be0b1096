"""A durable queue's directory: its ``.queue`` name file, and making the directory's new names durable
(queue_index.py makes them with the queue's first write)."""

from __future__ import annotations

import os
from pathlib import Path

from lavinpy.store.jsonfile import FILE_MODE, fsync_dir

QUEUE_NAME_FILE = ".queue"


def sync_new_directory(directory: Path) -> None:
    """Make a queue directory's new names durable: its ``.queue`` file's bytes, the names in it, and
    its own name in the vhost directory (any thread; a directory deleted meanwhile is skipped)."""
    try:
        fd = os.open(directory / QUEUE_NAME_FILE, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(directory)
    except FileNotFoundError:
        return  # the queue was deleted meanwhile
    fsync_dir(directory.parent)


def write_name_file(path: Path, name: bytes) -> None:
    """Write a queue's ``.queue`` file, owner-only as every file of the store (whatever the umask)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), FILE_MODE)
    try:
        os.write(fd, name)
    finally:
        os.close(fd)
