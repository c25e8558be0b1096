"""The data directory's ``.lock`` file: one broker per data directory.

``flock`` locks are released by the kernel when the process dies, so a crash never leaves a stale lock
behind; the pid written into the file is only there to make the refusal message useful.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class DataDirLocked(RuntimeError):
    """Another process holds the data directory's lock."""


class DataDirLock:
    """An exclusive, non-blocking ``flock`` on ``path`` (normally ``<data_dir>/.lock``)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock or raise DataDirLocked naming the directory and the holder's pid."""
        if self._fd is not None:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise DataDirLocked(
                f"data directory {self.path.parent} is in use by another lavinpy process "
                f"(pid {holder if holder is not None else 'unknown'})"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        # Write then trim (not trim then write) so a refused process never reads an empty file.
        pid = f"{os.getpid()}\n".encode("ascii")
        os.pwrite(fd, pid, 0)
        os.ftruncate(fd, len(pid))
        self._fd = fd

    def release(self) -> None:
        """Clear the pid and drop the lock. The file itself stays: deleting it would race a new locker."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> DataDirLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode("ascii").strip())
    except (ValueError, UnicodeDecodeError, OSError):
        return None
