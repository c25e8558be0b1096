"""An idle cluster writes nothing to etcd but its lease keepalives (which do not move etcd's revision):
no ISR rewrite, no new epoch, while no file changes."""

from __future__ import annotations

import json
import time

from tests.helpers import wait_until

from .harness import PREFIX, Cluster


def test_an_idle_cluster_leaves_etcd_alone(cluster: Cluster) -> None:
    nodes = cluster.start(3)
    cluster.wait_for_leader(60)
    ids = {n.node_id for n in nodes}

    def isr() -> set[str]:
        value = cluster.etcd.get(f"{PREFIX}/isr")
        return set(json.loads(value[0])) if value else set()

    wait_until(lambda: isr() == ids, 60, what="both followers in the ISR")
    time.sleep(3)  # the join's epoch stamped and recorded; the probe queue's changes streamed
    first = _revision(cluster)
    time.sleep(6)  # several heartbeats and epoch intervals
    writes = _revision(cluster) - first
    assert writes == 0, f"an idle cluster made {writes} etcd writes in 6 s (isr_epoch now {_epoch(cluster)})"


def _revision(cluster: Cluster) -> int:
    return int(cluster.etcd.call("kv/range", {"key": "aGVhbHRo"})["header"]["revision"])


def _epoch(cluster: Cluster) -> str:
    value = cluster.etcd.get(f"{PREFIX}/isr_epoch")
    return value[0] if value else "none"
