"""The wheel, built from what the Dockerfile's build stage copies, installs and runs the compiled codec.

This is what the container image does without Docker: the same files, `pip wheel`, an install into
a fresh environment, a start. It runs once per suite: in the compiled run (it is skipped under
LAVINPY_PURE_PYTHON=1, whose run is about the fallback).
"""

from __future__ import annotations

import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from .broker_proc import REPO, broker_env, port_args, start, stop, wait_for

pytestmark = [
    pytest.mark.skipif(os.environ.get("LAVINPY_PURE_PYTHON") == "1",
                       reason="built and started once, in the compiled run"),
    pytest.mark.timeout(120),
]


def build_stage_copies(dockerfile: Path) -> list[str]:
    """The sources named by COPY in the Dockerfile's first stage (the one that builds the wheel)."""
    sources: list[str] = []
    stage = 0
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0].upper() == "FROM":
            stage += 1
            if stage > 1:
                break
        elif words[0].upper() == "COPY":
            args = [w for w in words[1:] if not w.startswith("--")]
            sources += args[:-1]
    return sources


def see_dependencies_of_this_interpreter(python: str) -> None:
    """Puts this interpreter's site directories after the fresh environment's own, by a .pth file.

    A fresh venv's system site packages are those of the base interpreter; run from a venv (as the README
    has it), the dependencies are in that venv's site-packages, which the fresh one would not see. A .pth
    line adds a directory without running the .pth files in it, so an editable install of lavinpy found
    there stays out and the wheel's copy, first on the path, is the one imported."""
    own = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                         capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    ours = [*site.getsitepackages(), site.getusersitepackages()]
    Path(own, "outer-environment.pth").write_text("".join(f"{path}\n" for path in ours if Path(path).is_dir()))


def test_dockerfile_build_stage_copies_what_the_wheel_needs():
    copies = build_stage_copies(REPO / "Dockerfile")
    # setup.py declares the C extensions: without it the image runs the pure-Python path.
    assert {"pyproject.toml", "setup.py", "README.md", "lavinpy"} <= set(copies), copies


@pytest.mark.slow  # builds a wheel and a fresh venv
def test_installed_wheel_starts_with_the_compiled_codec(tmp_path: Path):
    compiler = sysconfig.get_config_var("CC") or "cc"
    if shutil.which(compiler.split()[0]) is None:
        pytest.skip(f"no C compiler ({compiler}): the wheel would hold the pure-Python path only")
    src = tmp_path / "src"
    src.mkdir()
    for name in build_stage_copies(REPO / "Dockerfile"):
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyc"))
        else:
            shutil.copy2(path, src / name)
    wheels = tmp_path / "wheels"
    # As the image's build stage runs it: an isolated build with the setuptools pyproject.toml asks for.
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(wheels), str(src)],
                   check=True, timeout=100, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    [wheel] = wheels.glob("lavinpy-*.whl")
    assert re.search(r"-cp\d+-cp\d+[a-z]*-", wheel.name), f"{wheel.name} is not a platform wheel: nothing compiled"

    # A fresh environment that sees the dependencies already installed here (no network needed); lavinpy
    # itself must come from the wheel, which the check of lavinpy.__file__ below makes sure of.
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=True, with_pip=False)
    python = str(env_dir / "bin" / "python")
    see_dependencies_of_this_interpreter(python)
    # Into the fresh venv whatever this environment holds: an editable lavinpy seen through PYTHONPATH (the
    # Spark fixture puts the repository there) or through the .pth would otherwise count as installed.
    no_path = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps",
                    "--no-index", "--ignore-installed", str(wheel)], check=True, timeout=60, env=no_path)
    clean = {k: v for k, v in broker_env().items() if k not in ("PYTHONPATH", "LAVINPY_PURE_PYTHON")}
    where = "import lavinpy, lavinpy.wire._cwire as c; print(lavinpy.__file__, c.__file__)"
    found = subprocess.run([python, "-c", where], cwd=tmp_path, env=clean, capture_output=True, text=True,
                           timeout=30)
    assert found.returncode == 0, found.stderr
    package_file, extension_file = found.stdout.split()
    assert package_file.startswith(str(env_dir)) and extension_file.startswith(str(env_dir)), found.stdout

    proc = start(port_args(tmp_path), tmp_path, clean, python=python)
    log = tmp_path / "stderr"
    try:
        wait_for(lambda: "lavinpy started" in log.read_text(), proc, "the started line")
    finally:
        assert stop(proc) == 0
    started = [line for line in log.read_text().splitlines() if "lavinpy started" in line]
    assert "compiled codec" in started[0], started
