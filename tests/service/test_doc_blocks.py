"""Every shell and Python block of docs/*.md runs as written, or says on the line before it why not.

The convention (the README's too, tests/service/test_readme_blocks.py):
- a block fenced as ```sh, ```bash, ```shell or ```python is run;
- one that cannot run here (a fragment, another machine, a certificate it needs) has, on the line
  right before its fence, `<!-- not run: the reason -->`;
- docs/testing.md's Python blocks are run by tests/testing/test_docs.py (each as the test file it
  names, under pytest with the plugin).
Blocks run one after the other, each file's in order, against one broker started for the module
(fresh data dir) on the default ports shifted by one offset: every 4- or 5-digit number of a block
is a port and moves by the same offset, so `15672` is that broker's HTTP port. The broker has
users guest/guest and admin/pw (both administrators), a user `app`, a vhost `/orders` and queues
`jobs` and `orders` in `/`; `lavinpyctl` talks to it without `--uri`. A shell block runs under
`bash -e` and fails on a non-zero exit, a traceback, or a JSON `"error"` in its output.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from .broker_proc import REPO
from .test_readme_blocks import (
    BROKER_PORTS,
    NOT_RUN,
    block_ports,
    environment,
    port_offset,
    run_shell,
    shifted,
    stop_everything_started_in,
)

DOCS = sorted((REPO / "docs").glob("*.md"))
RUN_LANGS = {"sh": "sh", "bash": "sh", "shell": "sh", "python": "python"}
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)
# Blocks another test runs: (file name, language) -> that test.
RUN_ELSEWHERE = {("testing.md", "python"): "tests/testing/test_docs.py"}
HOW_TO_MARK = ("make it run against a broker on the default ports (users guest/guest and admin/pw, vhost "
               "/orders, queues jobs and orders), or mark it as not runnable: put `<!-- not run: the reason -->` "
               "on the line right before its fence (see this test's docstring)")

pytestmark = pytest.mark.timeout(240)


class DocBlock:
    def __init__(self, path: Path, lang: str, body: str, line: int, skipped: str | None) -> None:
        self.path, self.lang, self.body, self.line, self.skipped = path, lang, body, line, skipped

    def __repr__(self) -> str:
        return f"docs/{self.path.name}:{self.line} ({self.lang})"


def doc_blocks(path: Path) -> list[DocBlock]:
    """The shell and Python blocks of one file, with their not-run reasons."""
    text = path.read_text()
    found = []
    for match in FENCE.finditer(text):
        lang = RUN_LANGS.get(match.group(1))
        if lang is None:
            continue
        before = text[:match.start()]
        marker = NOT_RUN.fullmatch(before[before.rstrip("\n").rfind("\n") + 1:])
        found.append(DocBlock(path, lang, match.group(2), before.count("\n") + 1,
                              marker.group("reason") if marker else None))
    return found


def runnable() -> list[DocBlock]:
    return [b for path in DOCS for b in doc_blocks(path)
            if b.skipped is None and (b.path.name, b.lang) not in RUN_ELSEWHERE]


def test_every_not_run_marker_stands_before_a_block_and_says_why() -> None:
    for path in DOCS:
        text = path.read_text()
        markers = [m.start() for m in re.finditer("^<!-- not run", text, re.M)]  # prose may quote the marker
        well_formed = [m.start() for m in re.finditer(NOT_RUN.pattern + r"```\w*", text)]
        stray = sorted(text.count("\n", 0, at) + 1 for at in set(markers) - set(well_formed))
        assert not stray, f"docs/{path.name}: lines {stray}: `<!-- not run: the reason -->` must be the line " \
                          f"right before a block's fence, with a reason"


def test_blocks_run_elsewhere_are_there() -> None:
    for (name, lang), test in RUN_ELSEWHERE.items():
        assert (REPO / test).exists() and any(b.lang == lang for b in doc_blocks(REPO / "docs" / name)), test


def _api(http_port: int, method: str, path: str, body: object) -> None:
    request = urllib.request.Request(f"http://127.0.0.1:{http_port}/api/{path}", method=method,
                                     data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json",
                                              "authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})  # guest:guest
    with urllib.request.urlopen(request, timeout=10):
        pass


@pytest.fixture(scope="module")
def docs_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, dict[str, str], Path]]:
    """One broker for every block, with the objects the docs' examples name."""
    tmp_path = tmp_path_factory.mktemp("doc-blocks")
    offset = port_offset(block_ports(runnable()) | set(BROKER_PORTS.values()))  # type: ignore[arg-type]
    env = environment(tmp_path)
    ports = {name: port + offset for name, port in BROKER_PORTS.items()}
    env["LAVINPYCTL_URI"] = f"http://guest:guest@127.0.0.1:{ports['http']}"
    cwd = tmp_path / "broker"
    cwd.mkdir()
    args = " ".join(f"--{name}-port {port}" for name, port in ports.items())
    run_shell(f"python3 -m lavinpy --data-dir data {args} >lavinpy.log 2>&1 &", cwd, env, 30)
    try:
        assert run_shell("lavinpyctl await_startup --timeout 30", cwd, env, 60).returncode == 0, \
            (cwd / "lavinpy.log").read_text()
        http = ports["http"]
        for user, tags in (("admin", "administrator"), ("app", "")):
            _api(http, "PUT", f"users/{user}", {"password": "pw", "tags": tags})
        _api(http, "PUT", "vhosts/%2Forders", {})
        for vhost in ("%2F", "%2Forders"):
            for user in ("admin", "guest", "app"):
                _api(http, "PUT", f"permissions/{vhost}/{user}", {"configure": ".*", "write": ".*", "read": ".*"})
        for queue in ("jobs", "orders"):
            _api(http, "PUT", f"queues/%2F/{queue}", {"durable": True})
        yield offset, env, tmp_path
    finally:
        stop_everything_started_in(cwd)


def test_doc_blocks_run(docs_broker: tuple[int, dict[str, str], Path]) -> None:
    offset, env, tmp_path = docs_broker
    failures = []
    for block in runnable():
        body = shifted(block.body, offset)
        if block.lang == "sh":
            done = run_shell(body, tmp_path, env, 120)
        else:
            (tmp_path / "block.py").write_text(body)
            done = subprocess.run([sys.executable, "block.py"], cwd=tmp_path, env=env, capture_output=True,
                                  text=True, timeout=120)
        output = done.stdout + done.stderr
        if done.returncode != 0 or "Traceback" in output or re.search(r'"error"\s*:', output):
            failures.append(f"{block} failed (exit {done.returncode}):\n{output[-1500:]}")
    assert not failures, "\n\n".join(failures) + f"\n\nA doc block that fails here: {HOW_TO_MARK}."
