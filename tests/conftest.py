"""Markers by place: every test under tests/cluster, tests/spark or tests/jepsen carries that directory's
marker, and every test that uses the headless browser (the ``browser`` fixture) carries ``browser``, so
that ``-m "not cluster and not spark"`` selects without each module having to say what it is."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent
DIRECTORY_MARKERS = {HERE / name: name for name in ("cluster", "spark", "jepsen")}
BROWSER_FIXTURE = "browser"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.path))
        for directory, marker in DIRECTORY_MARKERS.items():
            if directory in path.parents:
                item.add_marker(marker)
        if BROWSER_FIXTURE in getattr(item, "fixturenames", ()):
            item.add_marker("browser")
