"""Files of a data directory that belong to one node and are never replicated."""

from __future__ import annotations

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
