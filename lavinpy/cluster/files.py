"""Files of a data directory that belong to one node and are never replicated."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from ..store.datadir import CLEAN_STOP_MARKER

# The node's cluster identity: a copy would make two nodes one.
CLUSTERING_ID_FILE = ".clustering_id"

# Never copied to or from another node: the identity, the data dir's flock file, the clean-stop marker
# (a follower's copy is never "cleanly stopped": it recovers as after a crash when it becomes leader).
LOCAL_ONLY_FILES = {CLUSTERING_ID_FILE, ".lock", CLEAN_STOP_MARKER}

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
