"""The data directory layout: schema version, lock, and one directory per vhost named by SHA-1.

Names are hashed so that any vhost or queue name (slashes, unicode, 255 bytes) maps to a safe,
fixed-length directory name; the real name is kept in a ``.vhost`` (or ``.queue``) file beside it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import stat
from pathlib import Path

from lavinpy.store import changes
from lavinpy.store.jsonfile import DIR_MODE, FILE_MODE, fsync_dir, write_bytes_atomic
from lavinpy.store.lock import DataDirLock

log = logging.getLogger(__name__)

SCHEMA_VERSION = "1"
VHOST_NAME_FILE = ".vhost"
CLEAN_STOP_MARKER = "clean_shutdown"


class SchemaVersionError(RuntimeError):
    """The data directory was written by an incompatible lavinpy version."""


def sha1_name(name: str) -> str:
    """Lowercase hex SHA-1 of the UTF-8 name: the directory name of a vhost or queue."""
    return hashlib.sha1(name.encode("utf-8")).hexdigest()


def write_name_file(path: Path, name: str) -> None:
    """Write a ``.vhost``/``.queue`` name file durably (it is how the directory is identified)."""
    write_bytes_atomic(path, name.encode("utf-8"))


class DataDir:
    """A broker's data directory. ``open()`` before use, ``close()`` to release the lock."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.lock = DataDirLock(self.path / ".lock")

    @property
    def schema_version_file(self) -> Path:
        return self.path / "schema_version"

    @property
    def users_file(self) -> Path:
        return self.path / "users.json"

    @property
    def vhosts_file(self) -> Path:
        return self.path / "vhosts.json"

    def open(self) -> None:
        """Create the directory if needed, take the lock, then check or write ``schema_version``."""
        self.path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        # Lock first so that two brokers starting at once cannot both initialise the directory.
        self.lock.acquire()
        try:
            self._restrict_modes()
            self._check_schema_version()
        except BaseException:
            self.lock.release()
            raise

    def close(self) -> None:
        self.lock.release()

    def __enter__(self) -> DataDir:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _restrict_modes(self) -> None:
        """A directory written by an older version may be readable by others: make it owner-only.

        Closing the top directory protects every file below it; users.json (password hashes) is
        tightened as well in case the directory is shared on purpose.
        """
        for path, mode in ((self.path, DIR_MODE), (self.users_file, FILE_MODE)):
            try:
                if stat.S_IMODE(path.stat().st_mode) & 0o077:
                    os.chmod(path, mode)
                    log.info("%s was accessible to other users; mode set to %o", path, mode)
            except FileNotFoundError:
                pass
            except OSError as e:  # e.g. a mount we do not own: keep going, but say so
                log.warning("cannot restrict the mode of %s: %s", path, e)

    def _check_schema_version(self) -> None:
        try:
            found = self.schema_version_file.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            write_bytes_atomic(self.schema_version_file, (SCHEMA_VERSION + "\n").encode("ascii"))
            return
        except UnicodeDecodeError:
            found = "<unreadable>"
        if found != SCHEMA_VERSION:
            raise SchemaVersionError(
                f"data directory {self.path} has schema version {found!r}, this lavinpy supports "
                f"{SCHEMA_VERSION!r}; use a data directory written by a matching version"
            )

    @property
    def clean_stop_marker(self) -> Path:
        return self.path / CLEAN_STOP_MARKER

    def take_clean_stop_marker(self) -> bool:
        """At start: whether the last stop was clean; the marker is removed durably before anything
        else happens, so that a crash (or power loss) from now on cannot pass for a clean stop."""
        try:
            os.unlink(self.clean_stop_marker)
        except FileNotFoundError:
            return False
        fsync_dir(self.path)
        return True

    def write_clean_stop_marker(self) -> None:
        """At the very end of a clean stop (file and name synced)."""
        write_bytes_atomic(self.clean_stop_marker, b"1\n")

    def vhost_path(self, name: str, create: bool = False) -> Path:
        """The directory of vhost ``name``; with ``create`` it is made, with its ``.vhost`` name file."""
        path = self.path / sha1_name(name)
        if create:
            is_new = not path.is_dir()
            path.mkdir(mode=DIR_MODE, exist_ok=True)
            name_file = path / VHOST_NAME_FILE
            if not name_file.exists():
                write_name_file(name_file, name)
            if is_new:
                fsync_dir(self.path)
        return path

    def vhost_dirs(self) -> dict[str, Path]:
        """Every vhost directory on disk, by the name stored in its ``.vhost`` file."""
        found: dict[str, Path] = {}
        for entry in sorted(self.path.iterdir()):
            name_file = entry / VHOST_NAME_FILE
            if entry.is_dir() and name_file.is_file():
                found[name_file.read_text(encoding="utf-8")] = entry
        return found

    def remove_vhost(self, name: str) -> None:
        """Delete vhost ``name``'s directory and everything in it (no error if it is absent)."""
        path = self.path / sha1_name(name)
        if not path.exists():
            return
        # Remove the name file first: a crash half-way then leaves an anonymous directory that
        # vhost_dirs() ignores, not a vhost that comes back with half its files.
        try:
            os.unlink(path / VHOST_NAME_FILE)
            fsync_dir(path)
        except FileNotFoundError:
            pass
        shutil.rmtree(path)
        fsync_dir(self.path)
        changes.dir_deleted(path)
