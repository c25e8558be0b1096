"""From a wheel into a fresh venv: a project's test uses the fixture with no configuration (the plugin
comes from the installed package's pytest11 entry point)."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PROJECT_TEST = '''
import lavinpy
import pika


def test_a_message_through_the_fixtures_broker(lavinpy_vhost):
    connection = pika.BlockingConnection(pika.URLParameters(lavinpy_vhost))
    channel = connection.channel()
    channel.queue_declare("invoices")
    channel.basic_publish("", "invoices", b"paid")
    connection.close()
    assert lavinpy_vhost.wait_for_messages("invoices", 1) == 1
    assert [m.body for m in lavinpy_vhost.get("invoices")] == [b"paid"]
    print("LAVINPY_FROM", lavinpy.__file__)
'''


def outer_site_dirs() -> list[str]:
    """Where this interpreter's packages are (pika, pytest, lavinpy's dependencies). A venv made with
    system site packages sees the base interpreter's, not those of a venv this one runs in."""
    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    return [d for d in dict.fromkeys(dirs) if Path(d).is_dir()]


@pytest.mark.skipif(os.environ.get("LAVINPY_PURE_PYTHON") == "1", reason="once per suite, in the compiled run")
@pytest.mark.timeout(240)  # a wheel build and a venv: about 20 s
def test_a_fresh_venv_with_the_wheel_runs_a_test_with_the_fixture(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "lavinpy", src / "lavinpy", ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyc"))
    wheels = tmp_path / "wheels"
    # The C extensions are optional and tests/service/test_wheel.py builds them; a compiler that fails
    # at once leaves them out here, so that this test does not spend a minute compiling.
    build_env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "CC": "false"}
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(wheels), str(src)],
                   check=True, timeout=180, env=build_env, capture_output=True)
    [wheel] = wheels.glob("lavinpy-*.whl")

    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=True, with_pip=False)
    python = env_dir / "bin" / "python"
    # Without PYTHONPATH and ignoring what is installed: a lavinpy seen through PYTHONPATH (the Spark tests
    # put the repository there) or the outer environment would otherwise count as installed already.
    no_path = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    "--no-index", "--ignore-installed", str(wheel)], check=True, timeout=120, env=no_path)
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             check=True, capture_output=True, text=True, timeout=30).stdout.strip()
    # After the venv's own site-packages, so the wheel's lavinpy comes first.
    (Path(purelib) / "outer-site.pth").write_text("\n".join(outer_site_dirs()) + "\n")

    project = tmp_path / "project"
    project.mkdir()
    (project / "test_invoices.py").write_text(PROJECT_TEST)
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith(("LAVINPY_", "PYTEST_"))}
    run = subprocess.run([str(python), "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "test_invoices.py"],
                         cwd=project, env=clean, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "1 passed" in run.stdout
    [origin] = [line.split()[1] for line in run.stdout.splitlines() if line.startswith("LAVINPY_FROM")]
    assert origin.startswith(str(env_dir)), f"lavinpy came from {origin}, not from the wheel"

    # and the entry point's name turns the plugin off
    off = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:lavinpy",
                          "test_invoices.py"], cwd=project, env=clean, capture_output=True, text=True, timeout=120)
    assert off.returncode == 1 and "fixture 'lavinpy_vhost' not found" in off.stdout, off.stdout[-2000:]
