"""The memory watermark is taken of the cgroup's cap when one is set, not of the host's RAM."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from lavinpy.cgroups import cgroup_memory_limit
from lavinpy.config import parse_watermark

from .broker_proc import broker_env, port_args, stop, wait_for

V1_UNLIMITED = "9223372036854771712"
MIB = 1024 * 1024


def fake_tree(root: Path, cgroup: str, mountinfo: str | None, files: dict[str, str]) -> Path:
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text(cgroup)
    if mountinfo is not None:
        (root / "proc/self/mountinfo").write_text(mountinfo)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


V2_MOUNT = "30 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
V1_MOUNTS = ("31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755\n"
             "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
             "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n")


def test_v2_memory_max_of_the_own_cgroup(tmp_path: Path):
    root = fake_tree(tmp_path, "0::/system.slice/lavinpy.service\n", V2_MOUNT, {
        "sys/fs/cgroup/system.slice/lavinpy.service/memory.max": "536870912\n",
        "sys/fs/cgroup/system.slice/memory.max": "max\n",
    })
    assert cgroup_memory_limit(root) == 512 * MIB


def test_a_cap_changed_at_run_time_is_seen(tmp_path: Path):
    # docker update --memory: the same file, a new value; a cap set where there was none.
    root = fake_tree(tmp_path, "0::/docker/abc\n", V2_MOUNT, {"sys/fs/cgroup/docker/abc/memory.max": "max\n"})
    assert cgroup_memory_limit(root) is None
    (root / "sys/fs/cgroup/docker/abc/memory.max").write_text("419430400\n")
    assert cgroup_memory_limit(root) == 400 * MIB
    (root / "sys/fs/cgroup/docker/memory.max").write_text("314572800\n")
    assert cgroup_memory_limit(root) == 300 * MIB


def test_v2_max_and_absent_files_are_no_cap(tmp_path: Path):
    root = fake_tree(tmp_path, "0::/user.slice/session-1.scope\n", V2_MOUNT, {
        "sys/fs/cgroup/user.slice/session-1.scope/memory.max": "max\n",
    })
    assert cgroup_memory_limit(root) is None
    assert cgroup_memory_limit(tmp_path / "nothing-here") is None


def test_v2_a_parent_cap_binds_the_child(tmp_path: Path):
    root = fake_tree(tmp_path, "0::/capped.slice/lavinpy.service\n", V2_MOUNT, {
        "sys/fs/cgroup/capped.slice/lavinpy.service/memory.max": "max\n",
        "sys/fs/cgroup/capped.slice/memory.max": "268435456\n",
    })
    assert cgroup_memory_limit(root) == 256 * MIB


def test_v2_in_a_container_with_its_own_namespace(tmp_path: Path):
    # Docker with a cgroup namespace: the process sees "0::/" and its cap at the mount point.
    root = fake_tree(tmp_path, "0::/\n", V2_MOUNT, {"sys/fs/cgroup/memory.max": "1073741824\n"})
    assert cgroup_memory_limit(root) == 1024 * MIB


def test_v2_without_mountinfo_uses_the_usual_mount_point(tmp_path: Path):
    root = fake_tree(tmp_path, "0::/docker/abc\n", None, {"sys/fs/cgroup/docker/abc/memory.max": "104857600"})
    assert cgroup_memory_limit(root) == 100 * MIB


def test_v1_memory_limit_in_bytes(tmp_path: Path):
    cgroup = "9:name=systemd:/\n4:memory:/docker/0123abcd\n3:cpuset:/\n0::/\n"
    root = fake_tree(tmp_path, cgroup, V1_MOUNTS, {
        "sys/fs/cgroup/memory/docker/0123abcd/memory.limit_in_bytes": "805306368\n",
        "sys/fs/cgroup/memory/docker/memory.limit_in_bytes": V1_UNLIMITED,
        "sys/fs/cgroup/memory/memory.limit_in_bytes": V1_UNLIMITED,
    })
    assert cgroup_memory_limit(root) == 768 * MIB


def test_v1_unlimited_is_no_cap_and_the_host_path_seen_from_a_container(tmp_path: Path):
    cgroup = "4:memory:/docker/0123abcd\n"
    unlimited = fake_tree(tmp_path / "a", cgroup, V1_MOUNTS, {
        "sys/fs/cgroup/memory/memory.limit_in_bytes": V1_UNLIMITED})
    assert cgroup_memory_limit(unlimited) is None
    # No cgroup namespace: /proc/self/cgroup names the host's path, the mount shows the container's own cgroup.
    container = fake_tree(tmp_path / "b", cgroup, V1_MOUNTS, {
        "sys/fs/cgroup/memory/memory.limit_in_bytes": "209715200"})
    assert cgroup_memory_limit(container) == 200 * MIB


def test_mount_root_inside_the_hierarchy(tmp_path: Path):
    # A bind mount of a sub-hierarchy: the path is taken relative to the mount's root.
    mountinfo = "35 31 0:32 /kubepods /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    root = fake_tree(tmp_path, "0::/kubepods/pod1/c1\n", mountinfo, {
        "sys/fs/cgroup/pod1/c1/memory.max": "max",
        "sys/fs/cgroup/pod1/memory.max": "314572800"})
    assert cgroup_memory_limit(root) == 300 * MIB


def test_fraction_of_the_cap():
    assert parse_watermark("0.5", total=512 * MIB) == 256 * MIB
    assert parse_watermark("100MiB", total=512 * MIB) == 100 * MIB


def _writable_memory_cgroup() -> tuple[Path, str] | None:
    """(directory where a child cgroup with a memory cap can be made, the limit file's name), or None."""
    if os.geteuid() != 0:
        return None
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and controllers == "":
            here = Path("/sys/fs/cgroup") / path.lstrip("/")
            try:
                enabled = (here / "cgroup.subtree_control").read_text().split()
            except OSError:
                continue
            if "memory" in enabled and os.access(here, os.W_OK):
                return here, "memory.max"
        elif "memory" in controllers.split(","):
            here = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            if (here / "memory.limit_in_bytes").exists() and os.access(here, os.W_OK):
                return here, "memory.limit_in_bytes"
    return None


def test_broker_in_a_capped_child_cgroup(tmp_path: Path):
    found = _writable_memory_cgroup()
    if found is None:
        pytest.skip("needs root and a writable cgroup (v2 with the memory controller delegated, or v1 memory)")
    parent, limit_file = found
    child = parent / f"lavinpy-test-{os.getpid()}-{time.monotonic_ns()}"
    try:
        child.mkdir()
    except OSError as e:
        pytest.skip(f"cannot create a child cgroup in {parent}: {e}")
    try:
        (child / limit_file).write_text(str(256 * MIB))
        args = port_args(tmp_path)
        http_port = int(args[args.index("--http-port") + 1])
        # The broker joins the child cgroup before it execs: its own /proc/self/cgroup names the child.
        launcher = (f"import os, sys; open({str(child / 'cgroup.procs')!r}, 'w').write(str(os.getpid())); "
                    "os.execv(sys.executable, [sys.executable, '-m', 'lavinpy', *sys.argv[1:]])")
        env = broker_env({"LAVINPY_MEMORY_HIGH_WATERMARK": "0.5"})
        with open(tmp_path / "stderr", "ab") as err:
            proc = subprocess.Popen([sys.executable, "-c", launcher, *args], cwd=tmp_path, env=env,
                                    stdout=err, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: "lavinpy started" in (tmp_path / "stderr").read_text(), proc, "the broker's start")
            request = urllib.request.Request(f"http://127.0.0.1:{http_port}/api/nodes", headers={
                "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
            with urllib.request.urlopen(request, timeout=10) as response:
                node = json.load(response)[0]
        finally:
            assert stop(proc) == 0
        assert node["mem_limit"] == 128 * MIB, node["mem_limit"]
    finally:
        # The broker has exited; the cgroup is removable once the kernel has seen it empty.
        for _ in range(50):
            try:
                child.rmdir()
                break
            except OSError:
                time.sleep(0.1)
