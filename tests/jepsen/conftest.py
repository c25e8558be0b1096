"""Fixtures of the Jepsen-style suite: the settings (runner.py), the skip rules, the fault shim and a
``jepsen`` callable that runs one scenario on a fresh cluster in its own network namespaces."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from . import net
from .nemesis import build_shim
from .runner import Run, Settings, run_scenario, settings_from_env, summaries

PURE_PYTHON_REASON = "the fault schedules run once per CI run, on the compiled path"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "jepsen: fault-injection scenarios on real processes in network namespaces")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Every scenario's figures (confirmed, delivered, duplicates, overlap, failovers), passed or not."""
    if summaries:
        terminalreporter.section("jepsen scenarios")
        for text in summaries:
            terminalreporter.write_line(text)


@pytest.fixture(scope="session")
def jepsen_settings() -> Settings:
    env = os.environ
    if env.get("LAVINPY_JEPSEN") == "off":
        pytest.skip("LAVINPY_JEPSEN=off")
    if env.get("LAVINPY_PURE_PYTHON") == "1" and "LAVINPY_JEPSEN" not in env:
        pytest.skip(PURE_PYTHON_REASON)
    why = net.can_make_namespaces()
    if why:
        pytest.skip(f"network namespaces cannot be made: {why}")
    for tool in ("etcd", "ip", "unshare", "nsenter", "mkfs.ext4", "losetup"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is missing (Debian: etcd-server, iproute2, util-linux, e2fsprogs)")
    net.remove_stale()
    settings = settings_from_env()
    print(f"jepsen: mode {settings.mode}, seed {settings.seed}, {settings.etcd} etcd member(s), "
          f"nodes from {settings.source}")
    return settings


@pytest.fixture(scope="session")
def jepsen_shim(jepsen_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """The fault shim, built once per session; None without gcc."""
    if shutil.which("gcc") is None:
        return None
    return build_shim(Path(__file__).with_name("faultshim.c"), tmp_path_factory.mktemp("jepsen-shim"))


@pytest.fixture
def jepsen(jepsen_settings: Settings, jepsen_shim: Path | None, tmp_path: Path,
           request: pytest.FixtureRequest) -> Callable[..., Any]:
    """``jepsen(name, body, needs_shim=False, **run_options)`` runs one scenario and fails the test
    with the scenario, the seed, the lost ids and the nodes' last log lines when anything failed.
    The history, fault log, node logs and results stay in the run directory: LAVINPY_JEPSEN_DIR (kept,
    e.g. as CI artifacts) or the test's tmp_path."""
    def scenario(name: str, body: Callable[[Run], None], needs_shim: bool = False, **options: Any) -> Any:
        if needs_shim and jepsen_shim is None:
            pytest.skip("gcc is missing: the fault shim cannot be built")
        directory = tmp_path
        if os.environ.get("LAVINPY_JEPSEN_DIR"):
            directory = Path(os.environ["LAVINPY_JEPSEN_DIR"]) / f"{request.node.name}-{time.strftime('%Y%m%d-%H%M%S')}"
            directory.mkdir(parents=True)
        return run_scenario(name, body, jepsen_settings, directory, jepsen_shim, **options)
    return scenario
