"""Every Python block of docs/testing.md runs: a block headed ``# test_NAME.py`` as that file under pytest,
``# conftest.py`` under pytest with a test that uses the fixture it replaces, any other as a script."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .test_plugin import plugin_args

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "testing.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)


def blocks() -> list[str]:
    return BLOCK.findall(DOC.read_text())


def block_id(block: str) -> str:
    first = block.splitlines()[0]
    return first.removeprefix("# ") if first.startswith("# ") else first.split()[-1]


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    # The lavinpy of this checkout, whatever an installed one is.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_doc_has_an_example_for_each_client() -> None:
    names = [block_id(b) for b in blocks()]
    assert {"test_orders.py", "conftest.py", "test_events.py", "test_billing.py", "test_sensors.py"} <= set(names)
    assert len(names) == 7, names


@pytest.mark.parametrize("block", blocks(), ids=block_id)
def test_the_example_runs(block: str, tmp_path: Path) -> None:
    name = block.splitlines()[0].removeprefix("# ")
    if re.fullmatch(r"(test_\w+|conftest)\.py", name):
        (tmp_path / name).write_text(block)
        if name == "conftest.py":
            (tmp_path / "test_uses_it.py").write_text(
                "def test_it(lavinpy_vhost):\n    assert lavinpy_vhost.mqtt_port == 0\n")
        done = run(["-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin_args()], tmp_path)
        assert done.returncode == 0 and " passed" in done.stdout and "failed" not in done.stdout, \
            done.stdout[-4000:] + done.stderr[-2000:]
    else:
        (tmp_path / "example.py").write_text(block)
        done = run(["example.py"], tmp_path)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
        if "unittest.main()" in block:
            assert "OK" in done.stderr
