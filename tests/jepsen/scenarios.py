"""One targeted scenario per finding of the cluster-safety issue (F1..F10). Each is a function of a
Run (runner.py) set up with a healthy cluster and a running workload; the runner then heals, drains
and checks the history. What a scenario sees itself (a deposed healthy leader, a node leading when it
must not) goes to ``run.problems``, which fail the test with the checker's findings.

Where loss is the point the consumer is paused during the fault, so that a confirmed message sits
in the queue when the cluster fails over instead of being consumed before (then it would not count).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from tests.helpers import wait_until

from .cluster import ETCD_PEER_PORT, ETCD_PORT, PREFIX, Node
from .runner import RECOVERY_BOUND, Run


def _queue_file(run: Run, name: str) -> str:
    """A file of the run's queue, relative to the data dir (vhost "/")."""
    return f"{hashlib.sha1(b'/').hexdigest()}/{hashlib.sha1(run.queue.encode()).hexdigest()}/{name}"


def lease_ttl(run: Run) -> int:
    """The nodes' etcd lease TTL in seconds (clustering_lease_ttl; lavinpy's default 10)."""
    return int(run.cluster.options.extra_config.get("clustering_lease_ttl", 10))


def _watch(seconds: float, check: Callable[[], Any], interval: float = 0.2) -> list[Any]:
    """Call ``check`` every ``interval`` for ``seconds``; the distinct truthy values it returned."""
    seen: list[Any] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = check()
        if value and value not in seen:
            seen.append(value)
        time.sleep(interval)
    return seen


def _watch_for_takeover(run: Run, node: Node, seconds: float) -> list[Any]:
    """What served, watched until ``node`` serves alone or ``seconds`` passed: a failover the scenario
    arranged to ``node`` (every other node dead or frozen) has then happened, and the rest of the
    scenario runs on it."""
    seen: list[Any] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = ",".join(run.cluster.serving())
        if value and value not in seen:
            seen.append(value)
        if value == node.name:
            break
        time.sleep(0.3)
    return seen


def _isr_has(run: Run, node: Node) -> bool:
    return node.name in (run.cluster.isr() or [])


def _force_leader(run: Run, node: Node) -> str:
    """The operator's word (lavinpyctl force_leader), run in the client namespace."""
    endpoints = ",".join(f"{e.ip}:{ETCD_PORT}" for e in run.cluster.etcds)
    argv = ["ip", "netns", "exec", run.cluster.net.ns("c"), sys.executable, "-m", "lavinpy.cli.ctl", "force_leader",
            "--etcd-endpoints", endpoints, "--etcd-prefix", PREFIX, node.id]
    env = {"PYTHONPATH": str(run.settings.source), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=env)
    run.nemesis.note(f"operator: force_leader {node.name}", out=(done.stdout + done.stderr)[-300:])
    return done.stdout + done.stderr


# ---- F1: an ISR shrink must be committed to etcd before confirms go out without that follower ----

def f1_isr_shrink(run: Run) -> None:
    """The leader and one follower are cut off from etcd; the other follower loses its link to the
    leader (fast failure, its connection reset) but still reaches etcd, so it takes over. Whatever the
    old leader confirmed without it would be lost; and the old leader, which clients still reach, must
    have stopped serving before the new one serves (the checker's overlap)."""
    n = run.nemesis
    leader = n.leader()
    f1, f2 = n.followers(leader)
    run.control(consume=False)
    n.partition([leader.name, f2.name], n.etcd_names(), "blackhole")
    n.partition([leader.name], [f1.name], "prohibit")
    n.reset_replication(f1, leader)
    time.sleep(lease_ttl(run) + 4)  # past the cut-off leader's lease: f1 takes over
    run.heal("heal the F1 partition")
    run.control(consume=True)


# ---- F2: a joining follower enters the ISR only when it holds everything confirmed ----------------

def f2_join_caught_up(run: Run) -> None:
    """A follower restarts behind a slow link; the moment etcd lists it in the ISR, the leader and the
    other follower freeze and the leader's lease is revoked: it becomes the only candidate. It must
    hold every message confirmed so far."""
    n = run.nemesis
    run.control(consume=False, pad=2000)
    leader = n.leader()
    f1, f2 = n.followers(leader)
    n.slow(f1.name, "8mbit")
    n.kill(f1)
    time.sleep(6)
    n.restart(f1)
    try:
        wait_until(lambda: not _isr_has(run, f1), 5, 0.05, f"{f1.name} out of the ISR")
        wait_until(lambda: _isr_has(run, f1), 40, 0.02, f"{f1.name} back in the ISR")
    except AssertionError as e:
        run.problems.append(f"F2: {e}")
        return
    n.pause(leader)
    n.pause(f2)
    n.revoke_leader_lease()
    led = _watch_for_takeover(run, f1, 8)
    n.note(f"serving while {leader.name} and {f2.name} were frozen: {led}")
    n.kill(leader)
    n.resume(f2)
    run.heal("heal F2")
    run.control(consume=True, pad=0)


# ---- F3: a leader cut off from etcd stops serving before its lease can expire ---------------------

def f3_lease_deadline(run: Run) -> None:
    """The leader is black-holed from every etcd endpoint for 5 s past its lease TTL: it must stop serving
    before its lease expires and a follower takes over (the checker fails overlaps and late confirms)."""
    n = run.nemesis
    leader = n.leader()
    n.partition([leader.name], n.etcd_names(), "blackhole")
    time.sleep(lease_ttl(run) + 5)
    run.heal("heal the F3 partition")


# ---- F4: a follower notices a silent partition and rejoins by itself ------------------------------

def f4_silent_partition(run: Run) -> None:
    """A silent two-way partition between the leader and one follower for 8 s. The leader's host gives
    up its orphaned socket quickly, and the partition starts while the stream is idle (the follower has
    no unacknowledged bytes whose retransmission would draw an RST after the heal), so nothing is left
    to tell the follower: it must find out by itself and be back in the ISR within the recovery bound."""
    n = run.nemesis
    leader = n.leader()
    follower = n.followers(leader)[0]
    run.cluster.net.sysctl(leader.name, "net.ipv4.tcp_orphan_retries=1")
    run.control(publish=False, declare=False)
    time.sleep(1.5)
    n.partition([leader.name], [follower.name], "blackhole")
    time.sleep(0.5)
    run.control(publish=True, declare=True)
    time.sleep(8)
    run.heal("heal the F4 partition")


# ---- F5: a follower on a full disk never acknowledges what it did not write -----------------------

def f5_full_disk(run: Run, attempts: int | None = None) -> None:
    """Fill a follower's disk, publish a burst across an index block boundary, free the disk: twice in CI
    mode (the second time on a follower that rejoined after its disk was freed), four times in long mode.
    The follower must neither acknowledge the short write that ENOSPC gives (it would stay in
    the ISR with a queue index unlike the leader's) nor depose the healthy leader over its own disk
    errors. Then fail over to it (leader killed, the other follower frozen): no confirm may be lost."""
    n = run.nemesis
    leader = n.leader()
    f1, f2 = n.followers(leader)
    enq = _queue_file(run, "enq")
    run.control(consume=False, declare=False)
    if attempts is None:
        attempts = 4 if run.settings.long else 2
    for attempt in range(attempts):
        try:
            wait_until(lambda: _isr_has(run, f1), 30, 0.2, f"{f1.name} in the ISR")
        except AssertionError:
            run.problems.append(f"F5: {f1.name} did not rejoin the ISR after its disk was freed")
            return
        _quiesce(run)
        size = int(f1.disk("hash", enq).split()[1])
        entries = (4096 - size % 4096) // 8  # an entry is 8 bytes, a block 4096
        if entries > 6:
            _publish(run, entries - 6, rate=None)
        n.fill_disk(f1)
        _publish(run, 40, rate=2000)  # at once: the leader writes them in few, large index writes
        n.free_disk(f1)
        _quiesce(run)
        now = run.cluster.leader()
        if now is not leader:  # a follower's disk trouble is no reason to depose a healthy leader
            run.problems.append(f"F5: the leader changed from {leader.name} to {now and now.name} while "
                                f"{f1.name}'s disk was full")
            return
        compared = _index_in_sync(run, leader, f1, enq)
        if compared is None:
            run.problems.append(f"F5: {f1.name} was not back in the ISR, caught up with the leader, within "
                                f"{RECOVERY_BOUND:.0f} s after its disk was freed (attempt {attempt + 1})")
            return
        theirs, ours = compared
        if theirs != ours:
            run.problems.append(f"F5: {f1.name} is in the ISR with a queue index unlike the leader's "
                                f"(attempt {attempt + 1}, {theirs} vs {ours}): it acknowledged a write it "
                                f"did not complete")
            break
        n.note(f"F5 attempt {attempt + 1}: {f1.name} in the ISR, caught up, index equal")
    _fail_over_to(run, f1, leader, f2)
    run.control(consume=True, declare=True, budget=None)


def _caught_up(run: Run, leader: Node, follower: Node) -> bool:
    """etcd's ISR names ``follower`` and the leader counts it in sync with nothing unacknowledged: it
    has acknowledged every byte the leader streamed until now."""
    if not _isr_has(run, follower):
        return False
    try:
        nodes = run.cluster.http(leader, "/api/nodes")
    except Exception:  # noqa: BLE001 - a busy leader answers the next poll
        return False
    mine = [x for x in nodes if x.get("clustering_id") == follower.id]
    return bool(mine) and bool(mine[0].get("in_sync")) and mine[0].get("lag_bytes") == 0


def _index_in_sync(run: Run, leader: Node, follower: Node, rel: str) -> tuple[str, str] | None:
    """The follower's and the leader's hash of ``rel``, taken while the follower is in the ISR and has
    acknowledged everything the leader wrote to it; None when that does not come within the bound.

    The hashes are read one after the other, seconds apart on a loaded machine, while the follower may
    still be full-syncing after its disk was freed: compared there, a copy in the making looks like a
    short write acknowledged. So: the leader's hash, then the follower caught up (it has acknowledged
    whatever the leader wrote before that hash), the follower's hash, and the leader's hash again and
    the follower still caught up (nothing changed meanwhile). A follower that acknowledged a short write
    stays unlike the leader however long this waits."""
    deadline = time.monotonic() + RECOVERY_BOUND
    while time.monotonic() < deadline:
        before = leader.disk("hash", rel).split()[0]
        if not _caught_up(run, leader, follower):
            time.sleep(0.2)
            continue
        theirs = follower.disk("hash", rel).split()[0]
        after = leader.disk("hash", rel).split()[0]
        if before == after and _caught_up(run, leader, follower):
            return theirs, after
    return None


def _publish(run: Run, count: int, rate: float | None) -> None:
    invoked = run.status().get("invoke", 0)
    run.control(budget=invoked + count, rate=rate, publish=True)
    wait_until(lambda: run.status().get("invoke", 0) >= invoked + count, 30, 0.05, f"{count} publishes")
    _quiesce(run)


def _quiesce(run: Run) -> None:
    """No new publishes, and every one made has an outcome."""
    run.control(budget=run.status().get("invoke", 0))

    def settled() -> bool:
        s = run.status()
        return s.get("ok", 0) + s.get("fail", 0) + s.get("info", 0) >= s.get("invoke", 0)
    wait_until(settled, 30, 0.05, "every publish to have an outcome")
    time.sleep(0.3)


def _fail_over_to(run: Run, target: Node, leader: Node, other: Node) -> None:
    """Kill the leader and freeze ``other``: ``target`` is the only node that could lead."""
    n = run.nemesis
    n.kill(leader)
    n.pause(other)
    led = _watch_for_takeover(run, target, 10)
    n.note(f"serving with {leader.name} dead and {other.name} frozen: {led}")
    n.resume(other)


# ---- F6: a follower whose fsync failed does not count what it cannot prove -------------------------

def f6_fsync_eio(run: Run) -> None:
    """One fsync on a follower fails with EIO (the shim); the follower's machine then loses power,
    which takes what that fsync failed to write; then fail over to it."""
    n = run.nemesis
    leader = n.leader()
    f1, f2 = n.followers(leader)
    run.control(consume=False, declare=False)
    _quiesce(run)
    n.shim(f1, "eio", 1)
    # One message: the follower's batch for it fails, and nothing changes on the leader afterwards, so
    # the follower's files compare equal when it resyncs (what it reads is the page cache).
    _publish(run, 1, rate=None)
    try:
        wait_until(lambda: n.shim_claims(f1), 15, 0.1, "the shim to fail an fsync")
        time.sleep(1)
        wait_until(lambda: _isr_has(run, f1), 30, 0.1, f"{f1.name} back in the ISR")
    except AssertionError as e:
        run.problems.append(f"F6: {e}")
        return
    n.disarm(f1)
    run.control(budget=None)
    run.wait_confirms(100, 20)
    n.kill(leader)
    n.pause(f2)
    zeroed = n.power_loss(f1)
    n.note(f"F6: the power loss of {f1.name} zeroed {zeroed}")
    f1.start()
    led = _watch_for_takeover(run, f1, 10)
    n.note(f"serving with {leader.name} dead and {f2.name} frozen: {led}")
    n.resume(f2)
    run.control(consume=True)


# ---- F7: a follower half-way through a full sync never leads --------------------------------------

def f7_half_synced(run: Run) -> None:
    """A backlog of ~40 MB; the leader is cut off from etcd (so the ISR in etcd still lists every node);
    a follower loses its data dir (same node id) and full-syncs it again over a slow link. Half-way,
    the leader dies and the other follower freezes: the half-synced node must not lead."""
    n = run.nemesis
    run.control(consume=False, pad=64_000)
    run.wait_confirms(600, 60)
    run.control(pad=0)
    leader = n.leader()
    f1, f2 = n.followers(leader)
    n.slow(f1.name, "16mbit")
    n.partition([leader.name], n.etcd_names(), "blackhole")
    f1.kill()
    f1.disk("wipe")
    n.fault(f"{f1.name}'s data dir lost (node id kept)")
    f1.start()
    time.sleep(3)
    n.kill(leader)
    n.pause(f2)
    led = _watch(10, lambda: ",".join(run.cluster.serving()), 0.3)
    if f1.name in ",".join(led):
        run.problems.append(f"F7: {f1.name} led half-way through its full sync")
    n.note(f"serving with {leader.name} dead and {f2.name} frozen: {led}")
    n.resume(f2)
    run.heal("heal F7")
    run.control(consume=True)


# ---- F8: the etcd client moves on from an endpoint that answers errors ----------------------------

def f8_etcd_endpoint_errors(run: Run) -> None:
    """Three etcd members. e1, the first endpoint of every node, is replaced the way etcd recommends:
    removed, wiped, added back as a learner, which answers every client request with an error until
    it is promoted. Meanwhile all nodes restart (kill -9): they must come back through the other
    endpoints and serve within 15 s, while e1 still answers errors."""
    n, c = run.nemesis, run.cluster
    e1, e2, e3 = c.etcds
    members = json.loads(c.etcdctl("member", "list", "-w", "json", endpoints=[e2, e3]))["members"]
    old_id = next(m["ID"] for m in members if m.get("name") == "e1")
    # etcd refuses to remove a member until the others have been connected for a few seconds.
    wait_until(lambda: _etcdctl_ok(c, "member", "remove", f"{old_id:x}", endpoints=[e2, e3]), 20, 1.0,
               "etcd to let e1 be removed")
    e1.kill()
    shutil.rmtree(e1.data_dir, ignore_errors=True)
    new_id = wait_until(lambda: _add_learner(c, e1, [e2, e3]), 30, 1.0, "e1 to be added back as a learner")
    e1.start(c.initial_cluster, c.net.prefix, state="existing")
    n.fault("etcd member e1 replaced by a learner (it answers errors)")
    for node in c.nodes:
        n.kill(node)
    for node in c.nodes:
        node.start()
    n.event("heal", "restart every node")
    n.wait_recovered(15, "every node restarted while e1 is a learner")
    # A learner is promoted once it caught up.
    wait_until(lambda: _etcdctl_ok(c, "member", "promote", new_id, endpoints=[e2, e3]), 30, 1.0,
               "e1 to be promoted")
    n.event("heal", "e1 promoted to a voting member")


def _add_learner(c: Any, member: Any, endpoints: list[Any]) -> str:
    """The hex id of ``member`` added back as a learner ("" while etcd does not take it yet)."""
    for m in json.loads(c.etcdctl("member", "list", "-w", "json", endpoints=endpoints))["members"]:
        if f"http://{member.ip}:{ETCD_PEER_PORT}" in m.get("peerURLs", []):
            return f"{m['ID']:x}"
    _etcdctl_ok(c, "member", "add", member.name, "--learner", f"--peer-urls=http://{member.ip}:{ETCD_PEER_PORT}",
                endpoints=endpoints)
    return ""


def _etcdctl_ok(c: Any, *args: str, endpoints: list[Any]) -> bool:
    try:
        c.etcdctl(*args, endpoints=endpoints)
        return True
    except subprocess.CalledProcessError:
        return False


# ---- F9: a follower cut off from the leader alone does not depose it -------------------------------

def f9_healthy_leader(run: Run) -> None:
    """One follower loses its link to the leader (fast failure, connection reset) but not to etcd or
    the other follower. The leader is healthy: it must stay leader."""
    n, c = run.nemesis, run.cluster
    leader = n.leader()
    follower = n.followers(leader)[0]
    before = c.leader_key()
    n.partition([leader.name], [follower.name], "prohibit")
    n.reset_replication(follower, leader)
    changed = _watch(10, lambda: (k := c.leader_key()) != before and str(k and k["value"]), 0.2)
    if changed:
        run.problems.append(f"F9: the healthy leader {leader.name} was deposed (leader key then {changed})")
    run.heal("heal the F9 partition")


# ---- F10: no node leads without the ISR key unless an operator says so; old backups never lead --------

def f10_isr_key_deleted(run: Run) -> None:
    """The leader is killed and the ISR key deleted: no node may lead until the operator forces one."""
    n, c = run.nemesis, run.cluster
    leader = n.leader()
    f1, _ = n.followers(leader)
    # Killed first: a live leader writes the ISR key again with each epoch it records (about once a
    # second while the stream moves), after which a follower may rightly lead. Its lease keeps the
    # others from taking over for more than a second after the kill, long after the delete.
    n.kill(leader)
    n.delete_isr()
    led = _watch(lease_ttl(run) + 2, lambda: ",".join(c.serving()), 0.3)  # past the killed leader's lease
    if led:
        run.problems.append(f"F10: {led} led with no ISR key in etcd and no operator")
    else:
        said = _force_leader(run, f1)
        try:
            wait_until(lambda: c.serving() == [f1.name], 15, 0.2, f"{f1.name} to serve once forced")
        except AssertionError as e:
            run.problems.append(f"F10: {e} (lavinpyctl said: {said.strip()[-300:]})")
    run.heal("heal F10")


def f10_old_backup(run: Run) -> None:
    """A follower's data dir is restored from an old backup while the ISR lists it; the leader dies and
    the other follower freezes: the node with the old data must not lead."""
    n, c = run.nemesis, run.cluster
    run.control(consume=False)
    leader = n.leader()
    f1, f2 = n.followers(leader)
    backup = run.dir / "backup"
    f2.disk("snapshot", str(backup))
    n.note(f"backup of {f2.name}'s data dir")
    run.wait_confirms(800, 30)
    n.kill(leader)
    n.pause(f1)
    f2.kill()
    f2.disk("restore", str(backup))
    n.fault(f"{f2.name}'s data dir restored from the old backup")
    f2.start()
    # past the killed leader's lease, with f2 up and able to campaign
    led = _watch(lease_ttl(run) + 3, lambda: ",".join(c.serving()), 0.3)
    if f2.name in ",".join(led):
        run.problems.append(f"F10: {f2.name} led with its data restored from an old backup")
    n.resume(f1)
    run.heal("heal F10 (backup)")
    run.control(consume=True)
