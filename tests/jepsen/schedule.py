"""Seeded random fault schedules: cycles of one fault held a few seconds, a heal that must bring the
cluster back (one serving node, an ISR of three) within the recovery bound, and a little calm. The
seed fixes every choice; the runner prints it with any failure (LAVINPY_JEPSEN_SEED replays it)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from .runner import Run

Fault = Callable[[Run, random.Random], None]


def kill_leader(run: Run, rng: random.Random) -> None:
    n = run.nemesis
    n.kill(n.leader())
    time.sleep(rng.uniform(3, 8))


def kill_follower(run: Run, rng: random.Random) -> None:
    n = run.nemesis
    n.kill(rng.choice(n.followers()))
    time.sleep(rng.uniform(3, 6))


def pause_leader(run: Run, rng: random.Random) -> None:
    """Longer than the lease TTL (10 s): a follower takes over while the old leader sleeps."""
    n = run.nemesis
    n.pause(n.leader())
    time.sleep(rng.uniform(12, 15))


def pause_follower(run: Run, rng: random.Random) -> None:
    """Longer than the leader's acknowledgement timeout: the follower leaves the ISR."""
    n = run.nemesis
    n.pause(rng.choice(n.followers()))
    time.sleep(4)


def leader_etcd_blackhole(run: Run, rng: random.Random) -> None:
    n = run.nemesis
    n.partition([n.leader().name], n.etcd_names(), "blackhole")
    time.sleep(rng.uniform(6, 12))


def leader_follower_blackhole(run: Run, rng: random.Random) -> None:
    n = run.nemesis
    leader = n.leader()
    n.partition([leader.name], [rng.choice(n.followers(leader)).name], "blackhole", oneway=rng.random() < 0.3)
    time.sleep(rng.uniform(6, 12))


def leader_alone(run: Run, rng: random.Random) -> None:
    """The leader on one side, the followers and etcd on the other."""
    n = run.nemesis
    leader = n.leader()
    n.partition([leader.name], [f.name for f in n.followers(leader)] + n.etcd_names(), "blackhole")
    time.sleep(rng.uniform(6, 12))


def replication_reset(run: Run, rng: random.Random) -> None:
    """A fast failure between the leader and a follower, its replication connection reset."""
    n = run.nemesis
    leader = n.leader()
    follower = rng.choice(n.followers(leader))
    n.partition([leader.name], [follower.name], "prohibit")
    n.reset_replication(follower, leader)
    time.sleep(rng.uniform(6, 12))


def slow_follower(run: Run, rng: random.Random) -> None:
    n = run.nemesis
    n.slow(rng.choice(n.followers()).name, "256kbit")
    time.sleep(10)


def full_follower_disk(run: Run, rng: random.Random) -> None:
    n = run.nemesis
    n.fill_disk(rng.choice(n.followers()))
    time.sleep(10)


# ---- long mode only -------------------------------------------------------------------------------

def etcd_down(run: Run, rng: random.Random) -> None:
    """Every etcd member stopped for a minute: nobody may serve past its lease, all recover after."""
    n = run.nemesis
    for member in run.cluster.etcds:
        member.kill()
    n.fault("etcd down")
    time.sleep(60)
    for member in run.cluster.etcds:
        member.start(run.cluster.initial_cluster, run.cluster.net.prefix)
    n.event("heal", "etcd up")


def long_silent_partition(run: Run, rng: random.Random) -> None:
    n = run.nemesis
    leader = n.leader()
    n.partition([leader.name], [rng.choice(n.followers(leader)).name], "blackhole")
    time.sleep(150)


def follower_fsync_errors(run: Run, rng: random.Random) -> None:
    n = run.nemesis
    if run.cluster.options.shim is None:
        return
    n.shim(rng.choice(n.followers()), "eio", 3)
    time.sleep(8)


def follower_short_writes(run: Run, rng: random.Random) -> None:
    n = run.nemesis
    if run.cluster.options.shim is None:
        return
    n.shim(rng.choice(n.followers()), "short", 3)
    time.sleep(8)


def isolate_leader(run: Run, rng: random.Random) -> None:
    n = run.nemesis
    n.isolate(n.leader().name)
    time.sleep(rng.uniform(6, 12))


def etcd_member_isolated(run: Run, rng: random.Random) -> None:
    n = run.nemesis
    names = n.etcd_names()
    if len(names) < 3:
        return
    lonely = rng.choice(names)
    n.partition([lonely], [e for e in names if e != lonely], "blackhole")
    time.sleep(rng.uniform(10, 20))


CI_FAULTS: list[Fault] = [kill_leader, kill_follower, pause_leader, pause_follower, leader_etcd_blackhole,
                          leader_follower_blackhole, leader_alone, replication_reset, slow_follower,
                          full_follower_disk]
LONG_FAULTS: list[Fault] = CI_FAULTS + [etcd_down, long_silent_partition, follower_fsync_errors,
                                        follower_short_writes, isolate_leader, etcd_member_isolated]


def random_schedule(run: Run, seed: int, minutes: float, faults: list[Fault]) -> None:
    """Cycles of fault, heal and calm until ``minutes`` are used up (the last cycle starts while at
    least 30 s are left). The faults come in a shuffled order, each once before any comes again, so that
    a short schedule (CI's) has as many different faults as it has cycles."""
    rng = random.Random(seed)
    deadline = time.monotonic() + minutes * 60
    cycle = 0
    order: list[Fault] = []
    while deadline - time.monotonic() > 30:
        cycle += 1
        if not order:
            order = rng.sample(faults, len(faults))
        fault = order.pop()
        run.nemesis.note(f"cycle {cycle}: {fault.__name__}")
        fault(run, rng)
        run.heal(f"cycle {cycle} ({fault.__name__})")
        time.sleep(rng.uniform(2, 5))
