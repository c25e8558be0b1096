"""Fault primitives over a Cluster, each recorded in the run's fault log (JSON lines, monotonic ``t``)
so that the checker can name the fault nearest to a lost message.

Network faults are policy rules in the router namespace (net.py); process faults are signals to the
node's PID (stable across its re-exec when it steps down); disk faults are a ballast file on the
node's own ext4 image and the LD_PRELOAD shim's control file.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.helpers import wait_until

from .cluster import PREFIX, REPL_PORT, Cluster, Node
from .net import run


class Nemesis:
    def __init__(self, cluster: Cluster, log_path: Path) -> None:
        self.cluster = cluster
        self.net = cluster.net
        self.log_path = log_path
        self.paused: set[str] = set()
        self.filled: set[str] = set()
        self.shimmed: set[str] = set()
        self._generation = 0

    # ---- the fault log ------------------------------------------------------------------------------

    def event(self, kind: str, what: str = "", **fields: Any) -> None:
        with open(self.log_path, "a") as log:
            log.write(json.dumps({"t": round(time.monotonic(), 4), "k": kind, "what": what, **fields}) + "\n")

    def fault(self, what: str, **fields: Any) -> None:
        self.event("fault", what, **fields)

    def note(self, what: str, **fields: Any) -> None:
        self.event("note", what, **fields)

    # ---- who is who ---------------------------------------------------------------------------------

    def leader(self) -> Node:
        node = self.cluster.leader()
        assert node is not None, "no leader key in etcd"
        return node

    def followers(self, leader: Node | None = None) -> list[Node]:
        leader = leader or self.leader()
        return [n for n in self.cluster.nodes if n is not leader]

    # ---- network ------------------------------------------------------------------------------------

    def partition(self, a: list[str], b: list[str], kind: str = "blackhole", oneway: bool = False) -> None:
        self.net.partition(a, b, kind, oneway)
        self.fault(f"{kind} {'+'.join(a)} {'->' if oneway else '<->'} {'+'.join(b)}")

    def isolate(self, name: str) -> None:
        self.net.isolate(name)
        self.fault(f"isolate {name}")

    def slow(self, name: str, rate: str) -> None:
        self.net.slow(name, rate)
        self.fault(f"slow {name} to {rate}")

    def reset_replication(self, follower: Node, leader: Node) -> None:
        """Kill the follower's replication connection to the leader (an RST, if the router lets it pass)."""
        self.net.reset(follower.name, leader.name, REPL_PORT)
        self.fault(f"reset {follower.name}'s replication connection to {leader.name}")

    def etcd_names(self) -> list[str]:
        return [e.name for e in self.cluster.etcds]

    # ---- processes ----------------------------------------------------------------------------------

    def kill(self, node: Node) -> None:
        node.kill()
        self.paused.discard(node.name)
        self.fault(f"kill -9 {node.name}")

    def restart(self, node: Node) -> None:
        node.kill()
        node.start()
        self.event("heal", f"restart {node.name}")

    def pause(self, node: Node) -> None:
        node.signal(signal.SIGSTOP)
        self.paused.add(node.name)
        self.fault(f"pause {node.name}")

    def resume(self, node: Node) -> None:
        node.signal(signal.SIGCONT)
        self.paused.discard(node.name)
        self.event("heal", f"resume {node.name}")

    def revoke_leader_lease(self) -> int:
        """Revoke the leader key's lease through etcd (a leader crash as etcd sees it, without the crash)."""
        key = self.cluster.leader_key()
        assert key is not None and key["lease"], "no leader lease to revoke"
        self.cluster.etcd_call("lease/revoke", {"ID": str(key["lease"])})
        self.fault(f"revoke the leader's lease ({key['value']})")
        return int(key["lease"])

    def delete_isr(self) -> None:
        self.cluster.etcd_delete("isr")
        self.fault(f"delete {PREFIX}/isr")

    # ---- disks --------------------------------------------------------------------------------------

    def fill_disk(self, node: Node) -> int:
        """Take every free block of the node's file system; the bytes taken."""
        taken = int(node.disk("fill").strip() or 0)
        self.filled.add(node.name)
        self.fault(f"fill {node.name}'s disk ({taken} bytes)")
        return taken

    def free_disk(self, node: Node) -> None:
        node.disk("free")
        self.filled.discard(node.name)
        self.event("heal", f"free {node.name}'s disk")

    def shim(self, node: Node, mode: str, count: int) -> None:
        """Arm the node's fault shim: the next ``count`` fsyncs fail with EIO ("eio") or pwrites are
        cut in half ("short")."""
        assert self.cluster.options.shim is not None, "the fault shim was not built"
        self._generation += 1
        node.control.write_text(f"{self._generation} {mode} {count}\n")
        self.shimmed.add(node.name)
        self.fault(f"shim {mode} x{count} on {node.name}")

    def shim_claims(self, node: Node) -> list[Path]:
        """The faults the node's shim injected so far (one file each)."""
        return sorted(node.control.parent.glob(f"{node.control.name}.*.*"))

    def disarm(self, node: Node) -> None:
        node.control.unlink(missing_ok=True)
        self.shimmed.discard(node.name)

    def power_loss(self, node: Node) -> list[str]:
        """The node's machine loses power: the process dies and what failed fsyncs lost is gone from
        its disk (the page cache that still showed it goes too). The ranges zeroed."""
        node.kill()
        claims = [str(p) for p in self.shim_claims(node)]
        applied = json.loads(node.disk("powerloss", *claims).strip() or "[]") if claims else []
        self.fault(f"power loss of {node.name}", zeroed=applied)
        return applied

    # ---- healing ------------------------------------------------------------------------------------

    def heal_all(self, what: str = "heal all") -> None:
        """Undo every fault: network rules, pauses, dead nodes, full disks, armed shims."""
        self.net.heal()
        for node in self.cluster.nodes:
            self.disarm(node)
            if node.name in self.paused:
                node.signal(signal.SIGCONT)
            if node.name in self.filled:
                node.disk("free")
            if not node.alive:
                node.start()
        self.paused.clear()
        self.filled.clear()
        self.event("heal", what)

    def wait_recovered(self, bound: float, what: str) -> float | None:
        """Wait until one node serves, it holds the leader key and the ISR lists every node; record
        ``recovered`` (seconds) or ``recovery-failed`` (with the last state seen)."""
        try:
            after = self.cluster.wait_healthy(bound)
        except AssertionError as e:
            self.event("recovery-failed", f"{what}: {e}")
            return None
        self.event("recovered", what, after=round(after, 2))
        return after


def build_shim(source: Path, out_dir: Path) -> Path | None:
    """Compile the fault shim with gcc; None when no compiler is there."""
    out = out_dir / "jlfault.so"
    try:
        run("gcc", "-shared", "-fPIC", "-O2", "-Wall", "-o", str(out), str(source), "-ldl", "-lpthread")
    except (OSError, subprocess.CalledProcessError):
        return None
    return out


def wait_isr(cluster: Cluster, check: Any, timeout: float, what: str, interval: float = 0.05) -> list[str]:
    """Poll etcd's ISR (as node names) until ``check(isr)`` holds."""
    def poll() -> list[str] | None:
        isr = cluster.isr()
        return isr if isr is not None and check(isr) else None
    return wait_until(poll, timeout, interval, what)
