"""Fixtures of the cluster tests: a real etcd on free loopback ports, and lavinpy nodes (harness.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import Cluster, Etcd, etcd_binary


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """A failed cluster test's one-line message also says what etcd and the nodes said."""
    outcome = yield
    report = outcome.get_result()
    funcargs = getattr(item, "funcargs", {})
    cluster = funcargs.get("cluster") or funcargs.get("module_cluster")
    crash = getattr(report.longrepr, "reprcrash", None)
    if report.when == "call" and report.failed and cluster is not None and crash is not None:
        try:
            crash.message = f"{crash.message.splitlines()[0] if crash.message else ''}; {cluster.digest()}"
        except Exception as e:  # never hide the failure itself
            crash.message = f"{crash.message}; (no digest: {e})"


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
    yield from _cluster(tmp_path / "nodes", etcd)


@pytest.fixture(scope="module")
def module_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One etcd and one set of nodes for a whole module, for tests that leave the nodes as they found them
    (none kills, stops, pauses or cuts off a node): a cluster's start is most of such a test's time."""
    if etcd_binary() is None:
        pytest.skip("the etcd binary is missing (Debian: apt-get install etcd-server etcd-client)")
    base = tmp_path_factory.mktemp("module-cluster")
    server = Etcd(base / "etcd")
    server.start()
    try:
        yield from _cluster(base / "nodes", server)
    finally:
        server.stop()


def _cluster(directory: Path, etcd: Etcd) -> Iterator[Cluster]:
    nodes = Cluster(directory, etcd)
    try:
        yield nodes
    finally:
        nodes.stop_all()
        for node in nodes.nodes:  # shown by pytest only when the test failed
            print(f"--- {node.name}: last lines of its log ---\n" + "\n".join(node.log_text().splitlines()[-40:]))
