"""Files of a data directory that belong to one node and are never replicated."""

from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path

from ..store.datadir import CLEAN_STOP_MARKER

# The node's cluster identity: a copy would make two nodes one.
CLUSTERING_ID_FILE = ".clustering_id"
# What this node's copy is worth to the cluster (replica_state.py): each node judges its own.
REPLICA_STATE_FILE = ".replica_state"
# Files whose content this node cannot vouch for (file_applier): an fsync of them failed and they could
# not be deleted. suspect_files() below.
SUSPECT_FILE = ".replica_suspect"

# Never copied to or from another node: the identity, its replica state, the data dir's flock file, the
# clean-stop marker
# (a follower's copy is never "cleanly stopped": it recovers as after a crash when it becomes leader).
LOCAL_ONLY_FILES = {CLUSTERING_ID_FILE, REPLICA_STATE_FILE, SUSPECT_FILE, ".lock", CLEAN_STOP_MARKER}

# Names starting with these are per-process scratch: connection body spools (unlinked at once) and
# atomic-replace temporaries (.tmp, renamed over their target, which is replicated as a replace).
LOCAL_ONLY_PREFIXES = (".spool-",)
LOCAL_ONLY_SUFFIXES = (".tmp",)


def is_local_only(name: str) -> bool:
    """Whether the file ``name`` (a base name) stays on this node."""
    return name in LOCAL_ONLY_FILES or name.startswith(LOCAL_ONLY_PREFIXES) or name.endswith(LOCAL_ONLY_SUFFIXES)


def node_id(data_dir: Path) -> str:
    """This node's cluster id: made up once, kept in the data dir (never replicated)."""
    path = data_dir / CLUSTERING_ID_FILE
    try:
        text = path.read_text().strip()
        if text:
            return text
    except FileNotFoundError:
        pass
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    new_id = secrets.token_hex(8)
    tmp = path.with_name(CLUSTERING_ID_FILE + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, f"{new_id}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return new_id


# Suspects are also kept in memory, by data dir, for when even the marker cannot be written: the next full
# sync of this process still copies them.
_suspects_in_memory: dict[str, frozenset[str]] = {}


def suspect_files(data_dir: Path) -> set[str]:
    """Relative paths that a full sync must copy again whatever their hash says: after an fsync error
    the page cache may hold data the disk never got, and a hash read from it would lie."""
    suspects = set(_suspects_in_memory.get(os.path.abspath(data_dir), ()))
    try:
        suspects.update(line for line in (Path(data_dir) / SUSPECT_FILE).read_text().splitlines() if line)
    except FileNotFoundError:
        pass
    return suspects


def write_suspects(data_dir: Path, suspects: set[str]) -> None:
    """Record ``suspects`` (in memory at once, then durably); none removes the marker. Raises OSError."""
    key = os.path.abspath(data_dir)
    if suspects:
        _suspects_in_memory[key] = frozenset(suspects)
    else:
        _suspects_in_memory.pop(key, None)
    path = Path(data_dir) / SUSPECT_FILE
    if suspects:
        tmp = path.with_name(SUSPECT_FILE + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            view = memoryview("".join(f"{rel}\n" for rel in sorted(suspects)).encode())
            while view:
                written = os.write(fd, view)
                if not written:
                    raise OSError(errno.EIO, "write made no progress", str(tmp))
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
    directory = os.open(data_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
