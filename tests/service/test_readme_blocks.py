"""The README's shell and Python blocks run as written, so that they cannot rot.

Every ```sh and ```python block of README.md either runs here or is marked on the line before it with
`<!-- not run: the reason -->`. The blocks run on fresh data dirs and on ports shifted from the ones the
README names by one offset (every 4- or 5-digit number of a block is a port; shifting them all keeps the
block's arithmetic, e.g. `$((5671 + i))`, and leaves the defaults free for whoever runs the tests):
- the Python blocks, one after the other in one interpreter (a later block uses the channel of an earlier
  one), against one broker;
- the shell blocks against the same broker, except the high-availability one (it starts nodes with
  `--clustering`): it runs with a private etcd (Debian's etcd-server) and must end with every node in
  `cluster_status`.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import wait_until, worker_share

from .broker_proc import REPO

README = (REPO / "README.md").read_text()
NOT_RUN = re.compile(r"<!-- not run: (?P<reason>[^>]*\S) -->\n")
PORT = re.compile(r"(?<![\w.$/-])\d{4,5}(?![\w.])")
# The ports of the default single broker the blocks talk to.
BROKER_PORTS = {"amqp": 5672, "http": 15672, "mqtt": 1883, "prometheus": 15692}
ETCD_PORTS = (2379, 2380)

pytestmark = pytest.mark.timeout(180)


class Block:
    def __init__(self, lang: str, body: str, line: int, skipped: str | None) -> None:
        self.lang, self.body, self.line, self.skipped = lang, body, line, skipped

    def __repr__(self) -> str:
        return f"README.md:{self.line} ({self.lang})"


def readme_blocks() -> list[Block]:
    blocks = []
    for match in re.finditer(r"^```(\w*)\n(.*?)^```", README, re.M | re.S):
        if match.group(1) not in ("sh", "python"):
            continue
        before = README[:match.start()]
        marker = NOT_RUN.fullmatch(before[before.rstrip("\n").rfind("\n") + 1:])
        blocks.append(Block(match.group(1), match.group(2), before.count("\n") + 1,
                            marker.group("reason") if marker else None))
    return blocks


def run_blocks(lang: str, clustering: bool) -> list[Block]:
    return [b for b in readme_blocks()
            if b.skipped is None and b.lang == lang and ("--clustering" in b.body) == clustering]


def shifted(text: str, offset: int) -> str:
    return PORT.sub(lambda m: str(int(m.group()) + offset), text)


def port_offset(ports: set[int]) -> int:
    """An offset that moves every one of ``ports`` to a free loopback port below the ephemeral range."""
    for _ in range(200):
        offset = random.randrange(*worker_share((10000, 16000)))
        if all(free(port + offset) for port in ports):
            return offset
    raise AssertionError("no free port range for the README's blocks")


def free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def block_ports(blocks: list[Block]) -> set[int]:
    ports = {int(p) for b in blocks for p in PORT.findall(b.body)}
    return ports | {p + i for p in ports for i in (1, 2, 3)}  # the loops' `$((base + i))`


def environment(tmp_path: Path) -> dict[str, str]:
    """`python3` is this interpreter and `lavinpyctl` its script, whatever PATH holds; lavinpy is this tree."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    # A script, not a symlink: an interpreter reached through a link to a venv's link finds no
    # pyvenv.cfg beside the first link and starts without the venv's packages.
    python = bin_dir / "python3"
    python.unlink(missing_ok=True)
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    ctl = bin_dir / "lavinpyctl"
    ctl.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m lavinpy.cli.ctl "$@"\n')
    ctl.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAVINPY", "ETCD"))}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(REPO)
    if "LAVINPY_PURE_PYTHON" in os.environ:
        env["LAVINPY_PURE_PYTHON"] = os.environ["LAVINPY_PURE_PYTHON"]
    return env


def run_shell(script: str, cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """The block under `bash -e`. Its output goes to files, not pipes: what it leaves running in the
    background (a broker, etcd, the nodes) keeps them open."""
    with open(cwd / "block.out", "w+") as out, open(cwd / "block.err", "w+") as err:
        proc = subprocess.run(["bash", "-ec", script], cwd=cwd, env=env, stdout=out, stderr=err, text=True,
                              timeout=timeout, start_new_session=True)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read())


def session_pids(cwd: Path) -> list[int]:
    """The process groups whose working directory is ``cwd`` (each backgrounded block leaves one)."""
    groups = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if Path(os.readlink(proc / "cwd")) == cwd:
                    groups.add(os.getpgid(int(proc.name)))
            except OSError:
                continue
    return sorted(groups)


def stop_everything_started_in(cwd: Path) -> None:
    for _ in range(2):
        for sig in (signal.SIGTERM, signal.SIGKILL):
            groups = session_pids(cwd)
            for group in groups:
                if group == os.getpgrp():
                    continue  # never the test run's own
                try:
                    os.killpg(group, sig)
                except ProcessLookupError:
                    pass
            if groups and sig == signal.SIGTERM:
                time.sleep(2)


def test_every_not_run_marker_says_why_and_stands_before_a_block():
    markers = [m.start() for m in re.finditer("^<!-- not run", README, re.M)]  # prose may quote the marker
    well_formed = [m.start() for m in re.finditer(NOT_RUN.pattern + r"```(sh|python)\n", README)]
    assert markers == well_formed, [README.count("\n", 0, at) + 1 for at in set(markers) - set(well_formed)]
    skipped = [b for b in readme_blocks() if b.skipped]
    assert len(skipped) == len(markers) and all(b.skipped.strip() for b in skipped)
    assert len(run_blocks("python", False)) >= 3 and run_blocks("sh", False)
    assert len(run_blocks("sh", True)) == 1, "one high-availability block"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    """A broker on the README's default ports shifted by one offset, as `python3 -m lavinpy` would run."""
    blocks = run_blocks("python", False) + run_blocks("sh", False)
    offset = port_offset(block_ports(blocks) | set(BROKER_PORTS.values()))
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
        yield offset, env
    finally:
        stop_everything_started_in(cwd)


def test_python_blocks_run(broker: tuple[int, dict[str, str]], tmp_path: Path):
    offset, env = broker
    script = "\n".join(f"# {block}\n{shifted(block.body, offset)}" for block in run_blocks("python", False))
    # The dead-letter block calls the application's own handler by name.
    (tmp_path / "readme.py").write_text("def handle(body):\n    pass\n\n" + script)
    proc = subprocess.run([sys.executable, str(tmp_path / "readme.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "home/kitchen/temp b'21.5'" in proc.stdout, proc.stdout  # what the MQTT block says it prints
    listed = run_shell("lavinpyctl -f json list_queues name messages", tmp_path, env, 30)
    queues = {q["name"]: q["messages"] for q in json.loads(listed.stdout)}
    assert queues["hello"] == 1 and queues["jobs"] == 0 and queues["jobs.dlq"] == 0, queues


def test_shell_blocks_run(broker: tuple[int, dict[str, str]], tmp_path: Path):
    offset, env = broker
    for block in run_blocks("sh", False):
        proc = run_shell(shifted(block.body, offset), tmp_path, env, 120)
        assert proc.returncode == 0, f"{block}: {proc.stdout}\n{proc.stderr}"
        assert "Traceback" not in proc.stderr, f"{block}: {proc.stderr}"
        if "list_queues" in block.body:
            assert "orders" in proc.stdout and "rabbitmq_" in proc.stdout, proc.stdout


@pytest.mark.cluster
def test_high_availability_block_starts_three_nodes(tmp_path: Path):
    if shutil.which("etcd") is None:
        pytest.skip("the etcd binary is missing (Debian: apt-get install etcd-server etcd-client)")
    [block] = run_blocks("sh", True)
    assert "--port-offset $((i * 100))" in block.body, "the nodes' ports come from --port-offset"
    node_ports = {port + 100 * i for port in (*BROKER_PORTS.values(), 5679) for i in (1, 2, 3)}
    offset = port_offset(block_ports([block]) | node_ports | set(ETCD_PORTS))
    client, peer = (f"http://127.0.0.1:{port + offset}" for port in ETCD_PORTS)
    env = environment(tmp_path)
    # etcd and the nodes read where etcd listens from the environment; the block's own lines stay as written.
    env.update(ETCD_LISTEN_CLIENT_URLS=client, ETCD_ADVERTISE_CLIENT_URLS=client, ETCD_LISTEN_PEER_URLS=peer,
               ETCD_INITIAL_ADVERTISE_PEER_URLS=peer, ETCD_INITIAL_CLUSTER=f"default={peer}",
               LAVINPY_CLUSTERING_ETCD_ENDPOINTS=client)
    cwd = tmp_path / "ha"
    cwd.mkdir()
    # The nodes' offsets (3 digits, not taken for ports) move by the test's offset like every port does.
    script = shifted(block.body, offset).replace("/tmp/etcd", str(cwd / "etcd")) \
        .replace("--port-offset $((", f"--port-offset $(({offset} + ")
    try:
        proc = run_shell(script, cwd, env, 150)
        assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
        assert "Traceback" not in proc.stderr, proc.stderr
        uri = f"http://guest:guest@127.0.0.1:{15772 + offset}"
        nodes_at = {f"127.0.0.1:{5672 + 100 * i + offset}" for i in (1, 2, 3)}

        def nodes() -> set[str]:
            status = run_shell(f"lavinpyctl --uri {uri} -f json cluster_status", tmp_path, env, 30)
            if status.returncode != 0:
                return set()
            rows = json.loads(status.stdout)
            roles = sorted(row["role"] for row in rows)
            in_sync = all(row["in_sync"] for row in rows)
            return {row["amqp_address"] for row in rows} if roles == ["follower", "follower", "leader"] \
                and in_sync else set()

        # The block's cluster_status runs once the first node answers; the followers join within seconds.
        assert wait_until(nodes, 60, 0.5, "cluster_status to show a leader and two in-sync followers") == nodes_at
    finally:
        stop_everything_started_in(cwd)
