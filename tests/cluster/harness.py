"""A reusable cluster harness: a real etcd and lavinpy nodes as subprocesses on loopback.

``Etcd`` runs one etcd member on free ports with its own data dir; ``Cluster`` starts lavinpy nodes in
cluster mode (each with its own data dir and ports), finds the leader through etcd, kills nodes with
SIGKILL and restarts them. Nothing here knows what a test checks.
"""

from __future__ import annotations

import base64
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pika

from tests.helpers import free_port, wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
PREFIX = "lavinpy"


def etcd_binary() -> str | None:
    return shutil.which("etcd")


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class Etcd:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.client_port = free_port(below_ephemeral=True)
        self.peer_port = free_port(below_ephemeral=True)
        self.process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        client = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        with open(self.directory / "etcd.log", "ab") as log:
            self.process = subprocess.Popen(
                [etcd_binary() or "etcd", "--name", "n", "--data-dir", str(self.directory / "data"),
                 "--listen-client-urls", client, "--advertise-client-urls", client,
                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", f"n={peer}"],
                stdout=log, stderr=subprocess.STDOUT)
        wait_until(self._healthy, 15, 0.1, "etcd to answer")

    def _healthy(self) -> bool:
        try:
            self.call("kv/range", {"key": _b64("health")})
            return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None

    def call(self, path: str, body: dict) -> dict:
        request = urllib.request.Request(f"http://{self.endpoint}/v3/{path}", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=2) as response:
            return json.loads(response.read().decode().splitlines()[0] or "{}")

    def get(self, key: str) -> tuple[str, int] | None:
        """(value, lease) of ``key``, None when absent."""
        kvs = self.call("kv/range", {"key": _b64(key)}).get("kvs") or []
        if not kvs:
            return None
        return base64.b64decode(kvs[0].get("value", "")).decode(), int(kvs[0].get("lease", 0))

    def etcdctl(self, *args: str) -> str:
        env = {**os.environ, "ETCDCTL_API": "3"}
        return subprocess.run(["etcdctl", "--endpoints", self.endpoint, *args], env=env, check=True,
                              capture_output=True, text=True, timeout=10).stdout


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class Node:
    def __init__(self, name: str, directory: Path, etcd: Etcd, extra_args: list[str], host: str = "127.0.0.1") -> None:
        self.name = name
        self.host = host  # the loopback address it binds, advertises and (for a leader) is reached on
        self.directory = directory
        self.data_dir = directory / "data"
        self.amqp_port = free_port(below_ephemeral=True)
        self.http_port = free_port(below_ephemeral=True)
        self.clustering_port = free_port(below_ephemeral=True)
        self.mqtt_port = free_port(below_ephemeral=True)
        self.etcd = etcd
        self.extra_args = extra_args
        self.process: subprocess.Popen | None = None
        self.log_path = directory / "lavinpy.log"

    @property
    def node_id(self) -> str:
        """The node's cluster id (made by the node on its first start)."""
        return wait_until(lambda: _read(self.data_dir / ".clustering_id"), 10, what=f"{self.name}'s id")

    @property
    def uri(self) -> str:
        return f"tcp://{self.host}:{self.clustering_port}"

    @property
    def amqp_url(self) -> str:
        return f"amqp://guest:guest@{self.host}:{self.amqp_port}/%2F"

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def args(self) -> list[str]:
        return ["--data-dir", str(self.data_dir), "--bind", self.host, "--amqp-port", str(self.amqp_port),
                "--http-port", str(self.http_port), "--prometheus-port", "0", "--mqtt-port", str(self.mqtt_port),
                "--clustering", "--clustering-etcd-endpoints", self.etcd.endpoint, "--clustering-etcd-prefix", PREFIX,
                "--clustering-bind", self.host, "--clustering-port", str(self.clustering_port),
                *self.extra_args]

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        env = {k: v for k, v in env.items() if not k.startswith("LAVINPY_")}
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "lavinpy", *self.args], cwd=self.directory,
                                            env=env, stdout=log, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        """SIGKILL, and wait until the process is gone."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def terminate(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def amqp_serves(self, timeout: float = 1.0) -> bool:
        """A pika client on this node's AMQP port can open a channel and declare a queue."""
        params = pika.ConnectionParameters(self.host, self.amqp_port, socket_timeout=timeout,
                                           blocked_connection_timeout=timeout, connection_attempts=1,
                                           stack_timeout=timeout * 2)
        try:
            connection = pika.BlockingConnection(params)
        except Exception:
            return False
        try:
            connection.channel().queue_declare("cluster-probe", auto_delete=True)
            return True
        except Exception:
            return False
        finally:
            try:
                connection.close()
            except Exception:
                pass


class Cluster:
    def __init__(self, directory: Path, etcd: Etcd) -> None:
        self.directory = directory
        self.etcd = etcd
        self.nodes: list[Node] = []

    def add(self, count: int = 1, extra_args: list[str] | None = None, host: str = "127.0.0.1") -> list[Node]:
        added = []
        for _ in range(count):
            name = f"node{len(self.nodes) + 1}"
            node = Node(name, self.directory / name, self.etcd, extra_args or [], host)
            self.nodes.append(node)
            added.append(node)
        return added

    def start(self, count: int = 3, extra_args: list[str] | None = None) -> list[Node]:
        nodes = self.add(count, extra_args)
        for node in nodes:
            node.start()
        return nodes

    def leader_key(self) -> tuple[str, int] | None:
        """(value, lease) of the leader key."""
        try:
            return self.etcd.get(f"{PREFIX}/leader")
        except OSError:
            return None

    def leader(self) -> Node | None:
        """The node named by the leader key (whether or not it serves yet)."""
        key = self.leader_key()
        if key is None:
            return None
        return next((n for n in self.nodes if n.uri == key[0]), None)

    def wait_for_leader(self, timeout: float = 20, exclude: Node | None = None) -> Node:
        """The leader, once it serves AMQP on its own port."""
        def serving_leader() -> Node | None:
            node = self.leader()
            if node is None or node is exclude or not node.alive:
                return None
            return node if node.amqp_serves() else None
        return wait_until(serving_leader, timeout, 0.1, "a serving leader")

    def digest(self) -> str:
        """One line on what etcd and every node say, added to a failed test's message (a CI summary
        shows only its first line): the leader key, the ISR, and each node's last cluster log lines."""
        try:
            isr = self.etcd.get(f"{PREFIX}/isr")
        except OSError as e:
            isr = f"etcd: {e}"
        parts = [f"leader key {self.leader_key()}", f"isr {isr}"]
        for node in self.nodes:
            lines = [line[11:23] + " " + line[23:].split(": ", 1)[-1][:110] for line in node.log_text().splitlines()
                     if " lavinpy.cluster" in line or "WARNING" in line or "ERROR" in line][-4:]
            parts.append(f"{node.name} ({'alive' if node.alive else 'dead'}): " + " / ".join(lines))
        return " | ".join(parts)

    def followers(self) -> list[Node]:
        leader = self.leader()
        return [n for n in self.nodes if n is not leader and n.alive]

    def kill_leader(self) -> tuple[Node, float]:
        """SIGKILL the current leader; (the node, time.monotonic() of the kill)."""
        leader = self.leader()
        assert leader is not None, "no leader to kill"
        leader.kill()
        return leader, time.monotonic()

    def stop_all(self) -> None:
        for node in self.nodes:
            node.kill()


def _socket_inodes(pid: int) -> set[str]:
    """The inodes of ``pid``'s sockets (from /proc: the process is ours)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def _loopback_inode(local_port: int, remote_port: int) -> str | None:
    """The inode of the loopback TCP socket from ``local_port`` to ``remote_port`` (/proc/net/tcp)."""
    local, remote = f"0100007F:{local_port:04X}", f"0100007F:{remote_port:04X}"
    try:
        with open("/proc/net/tcp") as table:
            for line in table:
                fields = line.split()
                if len(fields) > 9 and fields[1] == local and fields[2] == remote:
                    return fields[9]
    except OSError:
        pass
    return None


class PeerRelay:
    """A TCP relay in front of one etcd member's peer port. The members reach each other only through
    these; the relay finds which process opened each connection (its socket in /proc), so a test can
    cut a member off from its peers both ways on loopback, without network namespaces."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port(below_ephemeral=True)
        self.refused: set[int] = set()  # pids whose connections are cut
        self._links: list[tuple[str | None, socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._listener.settimeout(0.2)
        self._open = True
        threading.Thread(target=self._accept, daemon=True).start()

    def refuse(self, pids: set[int]) -> None:
        """Cut the connections these processes opened to the relay, and refuse their new ones."""
        with self._lock:
            self.refused = set(pids)
            links = list(self._links)
        for inode, a, b in links:
            if self._refused(inode):
                _close(a, b)

    def _refused(self, inode: str | None) -> bool:
        return any(inode in _socket_inodes(pid) for pid in self.refused)

    def close(self) -> None:
        self._open = False
        with self._lock:
            links, self._links = self._links, []
        for _, a, b in links:
            _close(a, b)

    def _accept(self) -> None:
        while self._open:
            try:
                conn, (_, peer_port) = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                break
            inode = _loopback_inode(peer_port, self.port)
            with self._lock:
                refused = self._refused(inode)
            if refused:
                conn.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=2)
            except OSError:
                conn.close()
                continue
            conn.settimeout(None)
            upstream.settimeout(None)
            with self._lock:
                self._links.append((inode, conn, upstream))
            threading.Thread(target=_pump, args=(conn, upstream), daemon=True).start()
            threading.Thread(target=_pump, args=(upstream, conn), daemon=True).start()
        self._listener.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    _close(source, sink)


def _close(*sockets: socket.socket) -> None:
    for sock in sockets:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()


class EtcdMember(Etcd):
    """One member of an EtcdCluster; its peers reach it through its PeerRelay."""

    def __init__(self, directory: Path, name: str) -> None:
        super().__init__(directory)
        self.name = name
        self.relay = PeerRelay(self.peer_port)

    @property
    def advertised_peer_url(self) -> str:
        return f"http://127.0.0.1:{self.relay.port}"

    def launch(self, initial_cluster: str, token: str, extra_args: list[str]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        client = f"http://127.0.0.1:{self.client_port}"
        with open(self.directory / "etcd.log", "ab") as log:
            self.process = subprocess.Popen(
                [etcd_binary() or "etcd", "--name", self.name, "--data-dir", str(self.directory / "data"),
                 "--listen-client-urls", client, "--advertise-client-urls", client,
                 "--listen-peer-urls", f"http://127.0.0.1:{self.peer_port}",
                 "--initial-advertise-peer-urls", self.advertised_peer_url, "--initial-cluster", initial_cluster,
                 "--initial-cluster-token", token, "--initial-cluster-state", "new", *extra_args],
                stdout=log, stderr=subprocess.STDOUT)

    def signal(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signum)

    def has_leader(self) -> bool:
        """Whether this member can serve a linearizable read."""
        return self._healthy()


class _MemberExited(Exception):
    pass


# Raft timing for tests: a member notices a lost leader after 0.5 s instead of 1 s.
FAST_RAFT = ["--heartbeat-interval", "50", "--election-timeout", "500"]
# For tests that wait for a killed or cut-off leader's lease to run out: the same rules on a shorter clock
# than the default 10 s (a longer lease only makes them wait longer).
SHORT_LEASE_TTL = 5
SHORT_LEASE = ["--clustering-lease-ttl", str(SHORT_LEASE_TTL)]


class EtcdCluster:
    """Several etcd members on loopback, each behind a PeerRelay: ``isolate`` cuts one member off from
    the others (both ways, it keeps running and answering its clients), ``heal`` undoes it; ``pause``
    and ``resume`` stop and continue a member's process (SIGSTOP/SIGCONT)."""

    def __init__(self, directory: Path, size: int = 3, extra_args: list[str] | None = None) -> None:
        self.directory = directory
        self.size = size
        self.members = [EtcdMember(directory / f"m{i}", f"m{i}") for i in range(size)]
        self.extra_args = FAST_RAFT if extra_args is None else extra_args

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    def start(self, attempts: int = 3) -> None:
        """Start every member; again on fresh ports when one exits at once (a port taken meanwhile)."""
        for attempt in range(attempts):
            if attempt:
                self.stop()
                self.members = [EtcdMember(self.directory / f"a{attempt}m{i}", f"m{i}") for i in range(self.size)]
            initial = ",".join(f"{m.name}={m.advertised_peer_url}" for m in self.members)
            token = f"t{random.randrange(1 << 30)}"  # members of other tests' clusters never join this one
            for member in self.members:
                member.launch(initial, token, self.extra_args)
            try:
                self.wait_healthy()
                return
            except _MemberExited:
                continue
        raise AssertionError(f"etcd cluster did not start in {attempts} attempts (logs in {self.directory})")

    def wait_healthy(self, timeout: float = 15) -> None:
        def serves(member: EtcdMember) -> bool:
            if member.process is None or member.process.poll() is not None:
                raise _MemberExited(member.name)
            return member.has_leader()
        for member in self.members:
            wait_until(lambda m=member: serves(m), timeout, 0.1, f"etcd member {member.name} to serve")

    def isolate(self, member: EtcdMember) -> None:
        pids = {m.process.pid for m in self.members if m.process is not None}
        for other in self.members:
            # No one reaches the isolated member; it reaches no one.
            other.relay.refuse(pids if other is member else {member.process.pid})

    def heal(self) -> None:
        for member in self.members:
            member.relay.refuse(set())

    def pause(self, *members: EtcdMember) -> None:
        for member in members:
            member.signal(signal.SIGSTOP)

    def resume(self, *members: EtcdMember) -> None:
        for member in members:
            member.signal(signal.SIGCONT)

    def stop(self) -> None:
        for member in self.members:
            member.stop()  # SIGKILL ends a stopped process too
            member.relay.close()
