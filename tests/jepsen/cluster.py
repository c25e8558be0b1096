"""etcd members and lavinpy nodes as real processes, each in its own network namespace (net.py).

A node runs ``python3 -m lavinpy`` (the source tree on PYTHONPATH) in a private mount namespace
where its own ext4 image is loop-mounted (so that its disk can fill up), optionally in a time
namespace with its own monotonic offset, and with the fault shim preloaded. It is started, killed
and restarted with the same command on the same data dir. The test process talks to etcd and to
the nodes' HTTP ports from threads inside the client namespace.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.helpers import wait_until

from .net import Net, NetnsExecutor, run

PREFIX = "lavinpy"  # the nodes' etcd key prefix
AMQP_PORT, HTTP_PORT, PROM_PORT, REPL_PORT = 5672, 15672, 15692, 5679
ETCD_PORT, ETCD_PEER_PORT = 2379, 2380
USER, PASSWORD = "jepsen", "jepsen"
DISKUTIL = Path(__file__).with_name("diskutil.py")


@dataclass
class Options:
    source: Path  # the lavinpy source tree the nodes run
    run_dir: Path
    nodes: int = 3
    etcd: int = 1
    image_mb: int = 384
    shim: Path | None = None  # the built fault shim, None: nodes run without it
    time_offsets: bool = True  # each node in a time namespace with its own monotonic offset
    extra_config: dict[str, Any] = field(default_factory=dict)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _unb64(text: str | None) -> str:
    return base64.b64decode(text).decode(errors="replace") if text else ""


def _env(source: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAVINPY_", "JL_", "LD_PRELOAD"))}
    env["PYTHONPATH"] = str(source)
    return env


class EtcdMember:
    def __init__(self, name: str, net: Net, run_dir: Path) -> None:
        self.name = name
        self.net = net
        self.ip = net.ip(name)
        self.data_dir = run_dir / name
        self.log_path = run_dir / f"{name}.log"
        self.process: subprocess.Popen | None = None

    @property
    def client_url(self) -> str:
        return f"http://{self.ip}:{ETCD_PORT}"

    def start(self, initial_cluster: str, token: str, state: str = "") -> None:
        state = state or ("existing" if (self.data_dir / "member").exists() else "new")
        peer = f"http://{self.ip}:{ETCD_PEER_PORT}"
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                ["ip", "netns", "exec", self.net.ns(self.name), "etcd", "--name", self.name,
                 "--data-dir", str(self.data_dir), "--listen-client-urls", self.client_url,
                 "--advertise-client-urls", self.client_url, "--listen-peer-urls", peer,
                 "--initial-advertise-peer-urls", peer, "--initial-cluster", initial_cluster,
                 "--initial-cluster-state", state, "--initial-cluster-token", token],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def signal(self, sig: int) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)


class Node:
    """One lavinpy node: ``name`` n1..n3, in namespace net.ns(name), its image loop-mounted at ``mnt``."""

    def __init__(self, name: str, index: int, net: Net, options: Options, endpoints: str) -> None:
        self.name = name
        self.index = index
        self.net = net
        self.ip = net.ip(name)
        self.options = options
        d = options.run_dir
        self.image = d / f"{name}.img"
        self.mnt = d / f"{name}.mnt"
        self.data_dir = self.mnt / "data"
        self.config = d / f"{name}.yaml"
        self.pidfile = d / f"{name}.pid"
        self.control = d / f"{name}.fault"  # the shim's control file
        self.log_path = d / f"{name}.log"
        self.endpoints = endpoints
        self.process: subprocess.Popen | None = None
        self.pid = 0
        self.id = ""  # its cluster id, learnt from etcd
        self.starts = 0

    @property
    def uri(self) -> str:
        return f"tcp://{self.ip}:{REPL_PORT}"

    def prepare(self) -> None:
        """A fresh ext4 image and the settings file (once per cluster)."""
        self.mnt.mkdir(parents=True, exist_ok=True)
        with open(self.image, "wb") as f:
            f.truncate(self.options.image_mb * 1024 * 1024)
        # -m 0: no blocks reserved for root, so that a full disk is full for the node too.
        run("mkfs.ext4", "-q", "-F", "-m", "0", str(self.image))
        settings = {"data_dir": str(self.data_dir), "bind": [self.ip], "amqp_port": AMQP_PORT,
                    "http_port": HTTP_PORT, "prometheus_port": PROM_PORT, "mqtt_port": 0, "default_user": USER,
                    "default_password": PASSWORD, "loopback_users": [], "disk_free_limit": 8_000_000,
                    "heartbeat": 10, "clustering": True, "clustering_etcd_endpoints": self.endpoints,
                    "clustering_etcd_prefix": PREFIX, "clustering_bind": self.ip, "clustering_port": REPL_PORT,
                    "clustering_advertised_uri": self.uri, **self.options.extra_config}
        self.config.write_text(json.dumps(settings, indent=1))  # JSON is YAML

    def command(self) -> list[str]:
        script = (f"mount -o loop {self.image} {self.mnt} && mkdir -p {self.data_dir} && echo $$ > {self.pidfile} && "
                  f"exec {sys.executable} -m lavinpy --config {self.config}")
        wrap = ["unshare", "--mount", "--propagation", "private"]
        if self.options.time_offsets:
            # A different monotonic clock per node: nothing may compare monotonic times across processes.
            wrap += ["--time", "--fork", "--monotonic", str(100_000 * self.index)]
        return ["ip", "netns", "exec", self.net.ns(self.name), *wrap, "sh", "-c", script]

    def start(self) -> None:
        assert not self.alive, f"{self.name} already runs"
        self.wait_unmounted()
        self.pidfile.unlink(missing_ok=True)
        env = _env(self.options.source)
        if self.options.shim is not None:
            env.update(LD_PRELOAD=str(self.options.shim), JL_FAULT_CONTROL=str(self.control),
                       JL_FAULT_SCOPE=str(self.data_dir))
        with open(self.log_path, "ab") as log:
            log.write(f"=== start {self.starts + 1} at monotonic {time.monotonic():.3f}\n".encode())
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True, cwd=self.options.run_dir)
        self.starts += 1
        self.pid = 0
        self.pid = wait_until(self._read_pid, 15, 0.02, f"{self.name} to start")

    def _read_pid(self) -> int:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"{self.name} exited at start: {self.log_tail(5)}")
        try:
            return int(self.pidfile.read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive and self.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL the whole process group (the node and its namespace wrappers) and reap it."""
        if self.process is None:
            return
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)
        self.pid = 0

    def wait_unmounted(self) -> None:
        """Until no loop device holds the image (the last mount went with its namespace)."""
        wait_until(lambda: not run("losetup", "-j", str(self.image), check=False).strip(), 10, 0.05,
                   f"{self.name}'s image to be released")

    def release(self) -> None:
        """After the node is gone: its mount went with its namespace; make sure (a lazy umount, loop
        devices detached) so that no image stays busy."""
        with contextlib.suppress(AssertionError):
            self.wait_unmounted()
        run("umount", "-l", str(self.mnt), check=False)
        for line in run("losetup", "-j", str(self.image), check=False).splitlines():
            run("losetup", "-d", line.split(":", 1)[0], check=False)

    def disk(self, *args: str, timeout: float = 120) -> str:
        """Run diskutil.py where the node's file system is mounted: in its mount namespace while it runs,
        else in a private one of its own (the image must never be mounted twice at once)."""
        tool = [sys.executable, str(DISKUTIL), str(self.mnt), *args]
        if self.alive and self.pid:
            return run("nsenter", "-t", str(self.pid), "-m", "--", *tool, timeout=timeout)
        self.wait_unmounted()
        script = f"mount -o loop {self.image} {self.mnt} && exec \"$@\""
        return run("unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *tool,
                   timeout=timeout)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 12) -> str:
        """The last cluster, warning and error lines of the log (what tells what a node did)."""
        keep = [line for line in self.log_text().splitlines()
                if " lavinpy.cluster" in line or "WARNING" in line or "ERROR" in line or "CRITICAL" in line
                or line.startswith(("===", "Traceback", "  File")) or "Error" in line]
        return "\n".join(keep[-lines:])


class Cluster:
    """etcd members e1..eN, lavinpy nodes n1..nN and the client namespace c, on one private network."""

    def __init__(self, options: Options, run_id: int) -> None:
        self.options = options
        options.run_dir.mkdir(parents=True, exist_ok=True)
        members = {f"n{i}": i for i in range(1, options.nodes + 1)}
        members |= {f"e{i}": 10 + i for i in range(1, options.etcd + 1)}
        members["c"] = 100
        self.net = Net(run_id, members)
        self.etcds = [EtcdMember(f"e{i}", self.net, options.run_dir) for i in range(1, options.etcd + 1)]
        endpoints = [f"{e.ip}:{ETCD_PORT}" for e in self.etcds]
        if len(endpoints) == 1:  # three endpoints as in production: a black hole costs a timeout on each
            endpoints *= 3
        self.nodes = [Node(f"n{i}", i, self.net, options, ",".join(endpoints)) for i in range(1, options.nodes + 1)]
        self.client: NetnsExecutor | None = None

    # ---- life cycle ---------------------------------------------------------------------------------

    def start(self, timeout: float = 60) -> None:
        self.net.create()
        self.client = NetnsExecutor(self.net.ns("c"))
        for member in self.etcds:
            member.start(self.initial_cluster, self.net.prefix)
        wait_until(lambda: self._etcd_healthy(), 30, 0.2, "etcd to answer")
        for node in self.nodes:
            node.prepare()
            node.start()
        self.wait_healthy(timeout)

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()
        for member in self.etcds:
            member.kill()
        if self.client is not None:
            self.client.close()
            self.client = None
        self.net.destroy()
        for node in self.nodes:
            node.release()

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    # ---- etcd, from the client namespace ------------------------------------------------------------

    def etcd_call(self, path: str, body: dict[str, Any], timeout: float = 2.0) -> dict[str, Any]:
        """POST to the v3 gateway of the first member that answers (from the client namespace)."""
        assert self.client is not None

        def call() -> dict[str, Any]:
            errors = []
            for member in self.etcds:
                request = urllib.request.Request(f"{member.client_url}/v3/{path}", data=json.dumps(body).encode(),
                                                 headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(request, timeout=timeout) as response:
                        data = json.loads(response.read().decode().splitlines()[0] or "{}")
                except (OSError, ValueError) as e:
                    errors.append(f"{member.name}: {e}")
                    continue
                if "error" in data:
                    errors.append(f"{member.name}: {data['error']}")
                    continue
                return data
            raise OSError("; ".join(errors))
        return self.client.call(call, timeout=timeout * len(self.etcds) + 5)

    @property
    def initial_cluster(self) -> str:
        return ",".join(f"{e.name}=http://{e.ip}:{ETCD_PEER_PORT}" for e in self.etcds)

    def etcdctl(self, *args: str, endpoints: list[EtcdMember] | None = None) -> str:
        """etcdctl from the client namespace."""
        urls = ",".join(e.client_url for e in endpoints or self.etcds)
        return run("ip", "netns", "exec", self.net.ns("c"), "env", "ETCDCTL_API=3", "etcdctl", "--endpoints", urls,
                   "--command-timeout=5s", *args)

    def _etcd_healthy(self) -> bool:
        try:
            self.etcd_call("kv/range", {"key": _b64("health")})
            return True
        except OSError:
            return False

    def etcd_get(self, key: str, prefix: bool = False) -> list[dict[str, Any]]:
        body = {"key": _b64(f"{PREFIX}/{key}")}
        if prefix:
            body["range_end"] = _b64(f"{PREFIX}/{key}"[:-1] + chr(ord(f"{PREFIX}/{key}"[-1]) + 1))
        kvs = self.etcd_call("kv/range", body).get("kvs") or []
        return [{"key": _unb64(kv.get("key")), "value": _unb64(kv.get("value")), "lease": int(kv.get("lease", 0)),
                 "mod_revision": int(kv.get("mod_revision", 0))} for kv in kvs]

    def etcd_put(self, key: str, value: str) -> None:
        self.etcd_call("kv/put", {"key": _b64(f"{PREFIX}/{key}"), "value": _b64(value)})

    def etcd_delete(self, key: str) -> None:
        self.etcd_call("kv/deleterange", {"key": _b64(f"{PREFIX}/{key}")})

    def leader_key(self) -> dict[str, Any] | None:
        try:
            found = self.etcd_get("leader")
        except OSError:
            return None
        return found[0] if found else None

    def leader(self) -> Node | None:
        """The node named by the leader key (whether or not it serves)."""
        key = self.leader_key()
        return next((n for n in self.nodes if key and n.uri == key["value"]), None)

    def learn_ids(self) -> None:
        with contextlib.suppress(OSError):
            for kv in self.etcd_get("nodes/", prefix=True):
                info = json.loads(kv["value"])
                for node in self.nodes:
                    if node.uri == info.get("uri"):
                        node.id = str(info.get("id"))

    def isr(self) -> list[str] | None:
        """The ISR as node names (ids of unknown nodes as they are); None when the key is absent."""
        try:
            found = self.etcd_get("isr")
        except OSError:
            return None
        if not found:
            return None
        ids = json.loads(found[0]["value"])
        if any(i not in {n.id for n in self.nodes} for i in ids):
            self.learn_ids()
        names = {n.id: n.name for n in self.nodes if n.id}
        return sorted(names.get(i, i) for i in ids)

    # ---- nodes, from the client namespace -----------------------------------------------------------

    def serving(self, timeout: float = 0.5) -> list[str]:
        """The nodes whose own broker answers on the Prometheus port (only a leader's broker opens it)."""
        assert self.client is not None

        def probe(node: Node) -> bool:
            try:
                with urllib.request.urlopen(f"http://{node.ip}:{PROM_PORT}/jepsen-probe", timeout=timeout):
                    return True
            except urllib.error.HTTPError:
                return True  # an answer is an answer
            except OSError:
                return False
        return [n.name for n, up in zip(self.nodes, [self.client.call(probe, n) for n in self.nodes], strict=True)
                if up]

    def http(self, node: Node, path: str, timeout: float = 5.0) -> Any:
        """GET the management API through ``node`` (a follower forwards it to the leader)."""
        assert self.client is not None

        def get() -> Any:
            request = urllib.request.Request(f"http://{node.ip}:{HTTP_PORT}{path}")
            token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.loads(response.read())
        return self.client.call(get, timeout=timeout + 5)

    def health(self) -> tuple[bool, str]:
        """(healthy, why): every node alive, one serving node, it is the etcd leader, the ISR holds all."""
        serving = self.serving()
        leader = self.leader()
        isr = self.isr()
        names = sorted(n.name for n in self.nodes)
        state = f"serving {serving}, leader key {leader.name if leader else None}, isr {isr}"
        ok = (all(n.alive for n in self.nodes) and len(serving) == 1 and leader is not None
              and serving == [leader.name] and isr == names)
        return ok, state

    def wait_healthy(self, timeout: float) -> float:
        """Seconds until healthy; AssertionError with the last state when it does not come."""
        started = time.monotonic()
        last = [""]

        def check() -> bool:
            ok, last[0] = self.health()
            return ok
        try:
            wait_until(check, timeout, 0.2, "the cluster to recover")
        except AssertionError:
            raise AssertionError(f"no recovery within {timeout:.0f} s without an operator ({last[0]})")
        return time.monotonic() - started

    def digest(self) -> str:
        """What etcd and each node say: for a failure message."""
        parts = [f"leader key {self.leader_key()}", f"isr {self.isr()}"]
        for node in self.nodes:
            parts.append(f"--- {node.name} ({'alive' if node.alive else 'dead'}, id {node.id}):\n{node.log_tail()}")
        return "\n".join(parts)
