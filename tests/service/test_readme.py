"""The README's first screen, ports, scrape config and container line agree with the code and the Dockerfile."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from lavinpy import config

from .broker_proc import REPO

README = (REPO / "README.md").read_text()


def blocks(text: str) -> list[tuple[str, str, int]]:
    """(language, body, line where the block starts) of every fenced block."""
    found = []
    for match in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.M | re.S):
        found.append((match.group(1), match.group(2), text[:match.start()].count("\n") + 1))
    return found


def test_first_screen_is_start_test_dashboard_and_prometheus():
    (lang, body, _), (lang2, scrape, line2) = blocks(README)[:2]
    commands = [line for line in body.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert lang == "sh" and len(commands) == 3, commands
    assert commands[0].startswith("python3 -m venv ")
    assert "pip install -e ." in commands[1] and "python3 -m lavinpy" in commands[1]
    assert "pip install -e '.[test" in commands[2] and "pytest" in commands[2]
    between = README[README.index(body) + len(body):README.index(scrape)]
    assert "http://127.0.0.1:15672/" in between and "docs/grafana/README.md" in between
    assert lang2 == "yaml" and line2 < 40, "the scrape config must be on the first screen"
    [job] = yaml.safe_load(scrape)["scrape_configs"]
    assert job["metrics_path"] == "/metrics" and job["params"] == {"prefix": ["rabbitmq"]}
    assert job["static_configs"][0]["targets"] == [f"127.0.0.1:{config.Config().prometheus_port}"]


def test_scrape_config_is_valid_for_prometheus(tmp_path: Path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("no promtool (Debian's prometheus package) to check the scrape config with")
    scrape = [body for lang, body, _ in blocks(README) if lang == "yaml" and "scrape_configs" in body][0]
    (tmp_path / "prometheus.yml").write_text(scrape)
    proc = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ports_table_docker_run_and_expose_agree():
    rows = re.findall(r"^\| (\d+) \| `(\w+)` \|", README, re.M)
    table = {name: int(port) for port, name in rows}
    defaults = config.Config()
    known = {name: port for name, port in table.items() if hasattr(defaults, name)}
    assert {"amqp_port", "amqps_port", "http_port", "prometheus_port", "clustering_port"} <= set(known), table
    for name, port in known.items():
        assert getattr(defaults, name) == port, name
    dockerfile = (REPO / "Dockerfile").read_text()
    exposed = {int(p) for line in dockerfile.splitlines() if line.startswith("EXPOSE") for p in line.split()[1:]}
    client_ports = {port for name, port in table.items() if name != "clustering_port"}
    assert exposed == client_ports, (exposed, client_ports)
    run = README[README.index("docker run -d"):]
    run = run[:run.index("\n```")]
    published = {int(a) for a, b in re.findall(r"-p (\d+):(\d+)", run) if a == b}
    assert published == exposed, (published, exposed)
    assert "-v lavinpy-data:/var/lib/lavinpy" in run


def test_backup_section_names_the_replica_state_and_links_exist():
    section = README[README.index("### Backup, restore and upgrade"):]
    assert ".replica_state" in section and "docs/clustering.md" in section
    for link in re.findall(r"\]\(((?:docs|conf)/[^)#]+)\)", README):
        assert (REPO / link).exists(), link
