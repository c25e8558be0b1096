"""A node's durable word on its own data directory: may this copy serve as the cluster's data?

``.replica_state`` (never replicated) holds one JSON object:

- ``{"state": "syncing"}``: a full sync started and has not completed. Files may be half-copied, and
  recovery would delete what their indexes do not reference: this copy must never lead.
- ``{"state": "consistent", "epoch": E}``: a full sync completed; since then every batch of the stream
  was applied in order and fsynced before being acknowledged, so the directory is a prefix of the
  leader's. E is the last position (epoch) the leader stamped into the stream that this copy holds;
  etcd records the epoch every in-sync node holds, and a copy older than that (a restored backup)
  may not lead.
- ``{"state": "unsynced", "boot_id": B}``: this node leads with ``fsync: never``. Its writes are in the
  page cache only, which survives a crash of the process but not of the machine: the copy counts as
  consistent again only while the kernel that held that cache (boot id B) still runs.

No file: the node has never been part of a cluster. Writes are atomic and fsynced before they count.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..store.jsonfile import fsync_dir, write_bytes_atomic
from .files import REPLICA_STATE_FILE as STATE_FILE

SYNCING = "syncing"
CONSISTENT = "consistent"
UNSYNCED = "unsynced"
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@dataclass(frozen=True)
class ReplicaState:
    state: str
    boot_id: str = ""
    epoch: int = 0

    @property
    def consistent(self) -> bool:
        if self.state == CONSISTENT:
            return True
        return self.state == UNSYNCED and bool(self.boot_id) and self.boot_id == boot_id()


def boot_id() -> str:
    """The running kernel's boot id ("" where the system has none)."""
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return ""


def read(data_dir: Path) -> ReplicaState | None:
    """The recorded state; None when the node was never in a cluster. An unreadable file is "syncing"."""
    try:
        raw = (Path(data_dir) / STATE_FILE).read_bytes()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(raw)
        return ReplicaState(str(data["state"]), str(data.get("boot_id", "")), int(data.get("epoch", 0)))
    except (ValueError, KeyError, TypeError):
        return ReplicaState(SYNCING)


def write(data_dir: Path, state: str, epoch: int = 0) -> None:
    """Record ``state`` durably (blocking). UNSYNCED records the running kernel's boot id."""
    data: dict[str, str | int] = {"state": state, "epoch": epoch}
    if state == UNSYNCED:
        data["boot_id"] = boot_id()
    path = Path(data_dir) / STATE_FILE
    try:
        write_bytes_atomic(path, json.dumps(data).encode() + b"\n")
    except OSError:
        if state == CONSISTENT:
            raise
        # A full disk must not leave a "consistent" behind: removing it frees space rather than
        # needing it. (No file reads as "never in a cluster", which still cannot lead an existing
        # cluster: see ClusterNode._may_lead.)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            fsync_dir(path.parent)
        raise
