"""Fixtures of the cluster tests: a real etcd on free loopback ports, and lavinpy nodes (harness.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import Cluster, Etcd, etcd_binary


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[Etcd]:
    if etcd_binary() is None:
        pytest.skip("the etcd binary is missing (Debian: apt-get install etcd-server etcd-client)")
    server = Etcd(tmp_path / "etcd")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def cluster(tmp_path: Path, etcd: Etcd) -> Iterator[Cluster]:
    nodes = Cluster(tmp_path / "nodes", etcd)
    try:
        yield nodes
    finally:
        nodes.stop_all()
        for node in nodes.nodes:  # shown by pytest only when the test failed
            print(f"--- {node.name}: last lines of its log ---\n" + "\n".join(node.log_text().splitlines()[-40:]))
