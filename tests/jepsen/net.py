"""A private network of namespaces for one run: a router namespace (forwarding, no uplink) with one
veth port per member namespace (lavinpy nodes, etcd members, the client). Addresses exist only inside
these namespaces (10.200.K.2 for a member, 10.200.K.1 for its router port).

Faults live in the router, so no member can tell a partition from a slow peer:
- ``ip rule ... blackhole`` drops silently (a connect hangs), ``prohibit`` answers with an ICMP error
  (a connect fails at once: the sender also gets a prohibit route, see ``partition``); one-way or both
  ways.
- a port taken down isolates a member from everyone, the client included.
- ``tbf`` on a router port limits the bandwidth towards a member (netem is not available everywhere).

The test process reaches the namespaces through threads that entered the client namespace
(``NetnsExecutor``), so it needs no address of its own.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import ctypes
import os
import re
import signal
import subprocess
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
_NAME = re.compile(r"^jl([0-9a-f]+)_[0-9]+-")
_libc = ctypes.CDLL(None, use_errno=True)
_live: list[Net] = []  # destroyed at exit if a test did not get to it


class CommandFailed(subprocess.CalledProcessError):
    def __str__(self) -> str:
        return f"{' '.join(map(str, self.cmd))} failed ({self.returncode}): {(self.stderr or '').strip()[-500:]}"


def run(*argv: str, check: bool = True, timeout: float = 30) -> str:
    """Run a command, return its stdout; CommandFailed (with stderr) when it fails."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise CommandFailed(done.returncode, argv, done.stdout, done.stderr)
    return done.stdout


def can_make_namespaces() -> str:
    """"" when namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "needs root (network and mount namespaces)"
    probe = f"jl{os.getpid():x}_0-probe"
    try:
        run("ip", "netns", "add", probe)
    except (OSError, subprocess.CalledProcessError) as e:
        return f"`ip netns add` fails here: {getattr(e, 'stderr', '') or e}"
    run("ip", "netns", "del", probe, check=False)
    return ""


def remove_stale() -> None:
    """Namespaces left by runs whose process is gone (killed before its cleanup ran)."""
    for line in run("ip", "netns", "list", check=False).splitlines():
        name = line.split()[0] if line.split() else ""
        match = _NAME.match(name)
        if match is None or _alive(int(match.group(1), 16)):
            continue
        _kill_namespace(name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _kill_namespace(name: str) -> None:
    for pid in run("ip", "netns", "pids", name, check=False).split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    run("ip", "netns", "del", name, check=False)


class Net:
    """The namespaces of one run. ``members`` maps a member name to its subnet number (1-254)."""

    def __init__(self, run_id: int, members: dict[str, int]) -> None:
        self.prefix = f"jl{os.getpid():x}_{run_id}"
        self.members = dict(members)
        self.router = f"{self.prefix}-r"
        self._rules: list[list[str]] = []
        self._routes: set[tuple[str, str, str]] = set()
        self._slowed: set[str] = set()
        self._down: set[str] = set()
        self.created = False

    def ns(self, member: str) -> str:
        return f"{self.prefix}-{member}"

    def ip(self, member: str) -> str:
        return f"10.200.{self.members[member]}.2"

    def create(self) -> None:
        _live.append(self)
        self.created = True
        r = self.router
        run("ip", "netns", "add", r)
        run("ip", "-n", r, "link", "set", "lo", "up")
        # Every packet a prohibit rule stops gets its ICMP error (no rate limit): a connect fails at once.
        run("ip", "netns", "exec", r, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv4.icmp_ratelimit=0")
        for member, k in self.members.items():
            ns = self.ns(member)
            run("ip", "netns", "add", ns)
            run("ip", "-n", r, "link", "add", "name", member, "type", "veth", "peer", "name", "eth0", "netns", ns)
            run("ip", "-n", r, "addr", "add", f"10.200.{k}.1/24", "dev", member)
            run("ip", "-n", r, "link", "set", member, "up")
            run("ip", "-n", ns, "link", "set", "lo", "up")
            run("ip", "-n", ns, "addr", "add", f"10.200.{k}.2/24", "dev", "eth0")
            run("ip", "-n", ns, "link", "set", "eth0", "up")
            run("ip", "-n", ns, "route", "add", "default", "via", f"10.200.{k}.1")

    def destroy(self) -> None:
        """Kill whatever runs in the namespaces, then delete them (idempotent)."""
        if not self.created:
            return
        for member in self.members:
            _kill_namespace(self.ns(member))
        _kill_namespace(self.router)
        self.created = False
        with contextlib.suppress(ValueError):
            _live.remove(self)

    # ---- faults -------------------------------------------------------------------------------------

    def partition(self, a: Iterable[str], b: Iterable[str], kind: str = "blackhole", oneway: bool = False) -> None:
        """Cut traffic from every member of ``a`` to every member of ``b`` (and back unless ``oneway``)."""
        assert kind in ("blackhole", "prohibit", "unreachable")
        a, b = list(a), list(b)
        pairs = [(x, y) for x in a for y in b] + ([] if oneway else [(y, x) for x in a for y in b])
        for x, y in pairs:
            rule = ["from", self.ip(x), "to", self.ip(y), kind, "prio", str(100 + len(self._rules))]
            run("ip", "-n", self.router, "rule", "add", *rule)
            self._rules.append(rule)
            if kind != "blackhole":
                # The router's ICMP errors are rate-limited host-wide (a few, then one a second), after
                # which a connect would hang: the sender's own route makes every connect fail at once.
                run("ip", "-n", self.ns(x), "route", "replace", kind, f"{self.ip(y)}/32")
                self._routes.add((x, kind, self.ip(y)))

    def isolate(self, member: str) -> None:
        run("ip", "-n", self.router, "link", "set", member, "down")
        self._down.add(member)

    def slow(self, member: str, rate: str = "10mbit", latency: str = "2s") -> None:
        """Limit the bandwidth from the router to ``member`` (everything it receives)."""
        run("tc", "-n", self.router, "qdisc", "replace", "dev", member, "root", "tbf", "rate", rate,
            "burst", "32kbit", "latency", latency)
        self._slowed.add(member)

    def reset(self, member: str, peer: str, port: int) -> None:
        """Kill ``member``'s TCP connections to ``peer``:``port`` (an RST to the peer, if it gets through)."""
        run("ip", "netns", "exec", self.ns(member), "ss", "-K", "dst", self.ip(peer), "dport", "=", str(port),
            check=False)

    def sysctl(self, member: str, setting: str) -> None:
        run("ip", "netns", "exec", self.ns(member), "sysctl", "-qw", setting)

    def heal(self) -> None:
        """Remove every rule, rate limit and downed port."""
        for rule in reversed(self._rules):
            run("ip", "-n", self.router, "rule", "del", *rule, check=False)
        self._rules.clear()
        for member, kind, ip in self._routes:
            run("ip", "-n", self.ns(member), "route", "del", kind, f"{ip}/32", check=False)
        self._routes.clear()
        for member in self._slowed:
            run("tc", "-n", self.router, "qdisc", "del", "dev", member, "root", check=False)
        self._slowed.clear()
        for member in self._down:
            run("ip", "-n", self.router, "link", "set", member, "up", check=False)
        self._down.clear()

    @property
    def faulty(self) -> bool:
        return bool(self._rules or self._routes or self._slowed or self._down)


class NetnsExecutor:
    """Runs calls in threads that live in one network namespace (setns is per thread)."""

    def __init__(self, ns: str, workers: int = 4) -> None:
        self.ns = ns
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix=f"netns-{ns}",
                                                           initializer=_enter, initargs=(ns,))

    def call(self, fn: Callable[..., T], *args: Any, timeout: float = 60, **kwargs: Any) -> T:
        return self._pool.submit(fn, *args, **kwargs).result(timeout)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _enter(ns: str) -> None:
    fd = os.open(f"/run/netns/{ns}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"setns into {ns}: {os.strerror(error)}")
    finally:
        os.close(fd)


@atexit.register
def _destroy_all() -> None:
    for net in list(_live):
        with contextlib.suppress(Exception):
            net.destroy()
