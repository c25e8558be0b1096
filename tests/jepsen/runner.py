"""One scenario run: a fresh cluster, the workload in the client namespace, the scenario's faults, then
heal, wait for recovery, drain the queue, check the history and report.

Settings come from the environment (the suite also runs from the repository root, where a conftest
below it cannot add command line options):

- ``LAVINPY_JEPSEN``: unset or ``ci`` = CI mode; ``long`` = long mode (longer random phase, three etcd
  members, the nightly faults); ``off`` = skip the suite.
- ``LAVINPY_JEPSEN_SEED``: the seed of the random schedules (default: a fresh one, printed).
- ``LAVINPY_JEPSEN_ETCD``: etcd members, 1 or 3 (default 1 in CI mode, 3 in long mode).
- ``LAVINPY_JEPSEN_MINUTES``: length of the random phase (default 1 in CI mode, where each fault also has
  its targeted test; 30 in long mode).
- ``LAVINPY_JEPSEN_SOURCE``: the lavinpy source tree the nodes run (default this repository), e.g. a
  worktree of an older commit.
- ``LAVINPY_JEPSEN_DIR``: keep each run's directory (history, fault log, node logs, results.json) under
  this directory instead of pytest's temporary one.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.helpers import wait_until

from . import checker
from .cluster import AMQP_PORT, PASSWORD, PROM_PORT, USER, Cluster, Options
from .nemesis import Nemesis

REPO = Path(__file__).resolve().parents[2]
WORKLOAD = Path(__file__).with_name("workload.py")
RECOVERY_BOUND = 30.0  # seconds from a heal to one serving node and an ISR of three
FINAL_BOUND = 60.0
_runs = [0]
summaries: list[str] = []  # every scenario's summary, printed at the end of the session (conftest.py)


@dataclass
class Settings:
    mode: str = "ci"
    seed: int = 0
    etcd: int = 1
    minutes: float = 1.0
    source: Path = REPO

    @property
    def long(self) -> bool:
        return self.mode == "long"


def settings_from_env(env: dict[str, str] | None = None) -> Settings:
    env = dict(os.environ if env is None else env)
    mode = env.get("LAVINPY_JEPSEN", "") or "ci"
    long = mode == "long"
    seed = env.get("LAVINPY_JEPSEN_SEED")
    return Settings(mode=mode, seed=int(seed) if seed else random.SystemRandom().randrange(1, 1 << 31),
                    etcd=int(env.get("LAVINPY_JEPSEN_ETCD") or (3 if long else 1)),
                    minutes=float(env.get("LAVINPY_JEPSEN_MINUTES") or (30 if long else 1.0)),
                    source=Path(env.get("LAVINPY_JEPSEN_SOURCE") or REPO).resolve())


@dataclass
class WorkloadConfig:
    publishers: int = 2
    rate: float = 80.0  # messages per second per publisher: the 2 CPUs are shared
    inflight: int = 32
    pad: int = 0  # bytes of padding per message body
    confirm_timeout: float = 5.0
    declare_interval: float = 3.0
    prefetch: int = 100
    heartbeat: int = 4
    extra: dict[str, Any] = field(default_factory=dict)


class Run:
    """A scenario's cluster, workload and nemesis. ``problems`` collects the scenario's own findings."""

    def __init__(self, name: str, settings: Settings, directory: Path, shim: Path | None, etcd: int | None = None,
                 workload: WorkloadConfig | None = None, node_config: dict[str, Any] | None = None) -> None:
        self.name = name
        self.settings = settings
        self.dir = directory
        _runs[0] += 1
        options = Options(source=settings.source, run_dir=directory, etcd=etcd or settings.etcd, shim=shim,
                          extra_config=node_config or {})
        self.cluster = Cluster(options, _runs[0])
        self.nemesis = Nemesis(self.cluster, directory / "faults.jsonl")
        self.workload_config = workload or WorkloadConfig()
        self.history_path = directory / "history.jsonl"
        self.control_path = directory / "control.json"
        self.status_path = directory / "status.json"
        self.queue = f"jq-{name.lower()}"
        self.problems: list[str] = []
        self.result: checker.Result | None = None
        self._workload: subprocess.Popen | None = None
        self._control: dict[str, Any] = {}

    # ---- the workload -------------------------------------------------------------------------------

    def start_workload(self) -> None:
        c = self.cluster
        w = self.workload_config
        config = {"nodes": [{"name": n.name, "ip": n.ip} for n in c.nodes], "amqp_port": AMQP_PORT,
                  "prom_port": PROM_PORT, "user": USER, "password": PASSWORD, "queue": self.queue,
                  "history": str(self.history_path), "control": str(self.control_path),
                  "status": str(self.status_path), "publishers": w.publishers, "rate": w.rate,
                  "inflight": w.inflight, "pad": w.pad, "confirm_timeout": w.confirm_timeout,
                  "declare_interval": w.declare_interval, "declare_prefix": f"dq-{self.name.lower()}",
                  "probe_interval": 0.1, "prefetch": w.prefetch, "heartbeat": w.heartbeat, **w.extra}
        path = self.dir / "workload.json"
        path.write_text(json.dumps(config))
        self.control()
        with open(self.dir / "workload.log", "ab") as log:
            self._workload = subprocess.Popen(["ip", "netns", "exec", c.net.ns("c"), sys.executable, str(WORKLOAD),
                                               str(path)], stdout=log, stderr=subprocess.STDOUT,
                                              start_new_session=True)

    def control(self, **changes: Any) -> None:
        """Change what the workload does (publish, consume, declare: bools; budget: an invoke count)."""
        self._control.update(changes)
        tmp = self.control_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._control))
        tmp.replace(self.control_path)
        time.sleep(0.15)  # the workload reads it every 0.1 s

    def status(self) -> dict[str, Any]:
        if self._workload is not None and self._workload.poll() is not None:
            raise AssertionError(f"the workload exited: {self._tail(self.dir / 'workload.log')}")
        try:
            return json.loads(self.status_path.read_text())
        except (OSError, ValueError):
            return {}

    def wait_confirms(self, count: int, timeout: float = 30) -> None:
        """Until ``count`` more messages than now are confirmed."""
        target = self.status().get("ok", 0) + count
        wait_until(lambda: self.status().get("ok", 0) >= target, timeout, 0.1, f"{count} more confirms")

    def stop_workload(self) -> None:
        process = self._workload
        if process is None:
            return
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)
        self._workload = None

    # ---- the whole run ------------------------------------------------------------------------------

    def setup(self) -> None:
        self.cluster.start()
        self.cluster.learn_ids()
        self.nemesis.note("cluster healthy", leader=self.cluster.leader().name)
        self.start_workload()
        self.wait_confirms(40, 30)

    def heal(self, what: str = "heal all", bound: float = RECOVERY_BOUND) -> float | None:
        """Undo every fault and require recovery without an operator within ``bound`` seconds."""
        self.nemesis.heal_all(what)
        return self.nemesis.wait_recovered(bound, what)

    def finish(self) -> checker.Result:
        """Heal, drain, check. Returns the result; the caller raises on failures."""
        self.heal("final heal", FINAL_BOUND)
        self.control(publish=False, declare=False, consume=True)
        drained = self._drain(60)
        queues = self._queues()
        self.stop_workload()
        history = checker.read_jsonl(self.history_path)
        events = checker.read_jsonl(self.nemesis.log_path)
        result = checker.check(history, events, queues)
        if not drained:
            result.failures.append(f"the queue did not drain after healing ({self._queue_state()})")
        result.failures.extend(self.problems)
        result.figures["loadavg"] = os.getloadavg()
        (self.dir / "results.json").write_text(json.dumps({"scenario": self.name, "seed": self.settings.seed,
                                                           "figures": result.figures, "lost": result.lost,
                                                           "failures": result.failures}, indent=1))
        self.result = result
        return result

    def _queue_state(self) -> dict[str, Any] | None:
        for node in self.cluster.nodes:
            with contextlib.suppress(Exception):
                q = self.cluster.http(node, f"/api/queues/%2F/{self.queue}")
                return {"messages": q.get("messages"), "unacked": q.get("messages_unacknowledged")}
        return None

    def _drain(self, timeout: float) -> bool:
        """Until the queue is empty, nothing is unacknowledged and no delivery came for 2 s."""
        def drained() -> bool:
            state = self._queue_state()
            quiet = time.monotonic() - self.status().get("last_deliver", 0) > 2.0
            return bool(state) and state["messages"] == 0 and state["unacked"] == 0 and quiet
        try:
            wait_until(drained, timeout, 0.5, "the queue to drain")
            return True
        except AssertionError:
            return False

    def _queues(self) -> set[str] | None:
        for node in self.cluster.nodes:
            with contextlib.suppress(Exception):
                return {q["name"] for q in self.cluster.http(node, "/api/queues")}
        return None

    def teardown(self) -> None:
        self.stop_workload()
        self.cluster.stop()
        # The images and etcd's data (its WAL preallocates 64 MB) are big; logs and the history stay.
        for node in self.cluster.nodes:
            node.image.unlink(missing_ok=True)
            shutil.rmtree(node.mnt, ignore_errors=True)
        for member in self.cluster.etcds:
            shutil.rmtree(member.data_dir, ignore_errors=True)

    @staticmethod
    def _tail(path: Path, lines: int = 10) -> str:
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def report(self, error: BaseException | None = None) -> str:
        """The failure message: scenario and seed first (a CI summary shows the first line), then every
        failure, the lost ids, and the last lines of each node's log."""
        failures = list(self.result.failures if self.result else [])
        if error is not None:
            failures.insert(0, f"{type(error).__name__}: {error}")
        head = f"jepsen {self.name} (seed {self.settings.seed}, source {self.settings.source}): "
        lines = [head + (failures[0].splitlines()[0] if failures else "failed")]
        lines += [f"- {f}" for f in failures[1:]]
        if self.result is not None:
            lines.append(checker.summary(self.name, self.result))
            lines += [f"  lost {x['id']}: confirmed at {x['confirmed_at']} via {x['node']}, nearest fault {x['fault']}"
                      for x in self.result.lost[:50]]
        lines.append(f"run directory: {self.dir}")
        try:
            lines.append(self.cluster.digest())
        except Exception as e:  # noqa: BLE001 - never hide the failure itself
            lines.append(f"(no digest: {e})")
        lines.append(f"--- workload log:\n{self._tail(self.dir / 'workload.log')}")
        return "\n".join(lines)


def run_scenario(name: str, body: Callable[[Run], None], settings: Settings, directory: Path, shim: Path | None,
                 **options: Any) -> checker.Result:
    """Set up, run ``body``, heal and check; AssertionError with the whole report when anything failed."""
    run = Run(name, settings, directory, shim, **options)
    error: BaseException | None = None
    try:
        run.setup()
        body(run)
        result = run.finish()
    except Exception as e:  # noqa: BLE001 - reported with the nodes' logs below
        error = e
    try:
        if run.result is not None:
            summaries.append(checker.summary(name, run.result))
        if error is None and result.ok:
            print(checker.summary(name, result))
            return result
        message = run.report(error)
    finally:
        run.teardown()
    print(message)
    raise AssertionError(message) from error
