"""Election among three nodes, failover after kill -9 of the leader, and the old leader's return."""

from __future__ import annotations

import json
import time

from tests.helpers import wait_until

from .harness import PREFIX, Cluster

FAILOVER_LIMIT = 5.0  # seconds from the kill to a follower serving AMQP (the target)


def test_one_leader_failover_within_5s_and_old_leader_rejoins_as_follower(cluster: Cluster) -> None:
    nodes = cluster.start(3)
    leader = cluster.wait_for_leader(30)
    assert cluster.leader_key()[0] == leader.uri
    elected = [n.name for n in nodes if "elected leader" in n.log_text()]
    assert elected == [leader.name], f"exactly one node must have been elected: {elected}"
    followers = [n for n in nodes if n is not leader]
    ids = {n.node_id for n in nodes}
    registered = cluster.etcd.etcdctl("get", "--prefix", "--keys-only", f"{PREFIX}/nodes/").split()
    assert {key.rsplit("/", 1)[1] for key in registered} == ids
    for follower in followers:  # followers forward their AMQP port to the leader
        wait_until(lambda f=follower: f"following leader {leader.node_id}" in f.log_text(), 10,
                   what=f"{follower.name} to follow")
        assert follower.amqp_serves(2)
    time.sleep(2.5)  # past the grace a just-elected leader gets
    # Killed before its followers are in the ISR, the leader would leave no node that may lead (a slow
    # start on a loaded machine takes longer than the grace).
    wait_until(lambda: set(_isr(cluster)) == ids, 30, what="every node in the ISR")
    in_sync = _isr(cluster)

    leader.kill()
    killed_at = time.monotonic()
    successor = cluster.wait_for_leader(FAILOVER_LIMIT + 5, exclude=leader)
    failover = time.monotonic() - killed_at
    print(f"failover: {successor.name} served AMQP {failover:.2f} s after the kill -9 of {leader.name}")
    assert successor in followers and successor.node_id in in_sync
    assert failover < FAILOVER_LIMIT
    key = cluster.leader_key()

    leader.start()  # the old leader comes back: it follows the new one
    wait_until(lambda: f"following leader {successor.node_id}" in leader.log_text().rsplit("elected leader", 1)[-1],
               20, what="the old leader to follow the new one")
    assert cluster.leader_key() == key
    assert leader.amqp_serves(2)  # its port forwards to the new leader
    restarted_log = leader.log_text().rsplit("joined", 1)[-1]
    assert "elected leader" not in restarted_log
    # after its sync the new leader records it in the ISR again
    wait_until(lambda: leader.node_id in _isr(cluster), 30, what="the old leader back in the ISR")


def _isr(cluster: Cluster) -> list[str]:
    value = cluster.etcd.get(f"{PREFIX}/isr")
    return json.loads(value[0]) if value else []


def test_leader_hooks_run_on_election_and_on_losing_the_lease(cluster: Cluster) -> None:
    (node,) = cluster.start(1, ["--clustering-on-leader-elected", "echo elected >> hooks.txt",
                                "--clustering-on-leader-lost", "echo lost >> hooks.txt"])
    hooks = node.directory / "hooks.txt"  # the commands run in the node's working directory
    assert cluster.wait_for_leader(30) is node
    wait_until(lambda: hooks.exists() and hooks.read_text() == "elected\n", 5, what="the elected hook")
    _, lease = cluster.leader_key()
    cluster.etcd.etcdctl("lease", "revoke", format(lease, "x"))
    # It steps down (lost), rejoins, and as the only node is elected again (elected).
    wait_until(lambda: hooks.read_text() == "elected\nlost\nelected\n", 20, 0.1, "the lost and elected hooks")
    assert cluster.leader_key()[1] != lease


def test_leader_killed_and_restarted_at_once_settles_on_one_leader(cluster: Cluster) -> None:
    cluster.start(3)
    leader = cluster.wait_for_leader(30)
    time.sleep(2.5)
    wait_until(lambda: set(_isr(cluster)) == {n.node_id for n in cluster.nodes}, 30, what="every node in the ISR")
    leader.kill()
    leader.start()  # back before anyone noticed: it or a follower leads, and the term then holds
    cluster.wait_for_leader(15)
    key = cluster.leader_key()
    time.sleep(3)
    assert cluster.leader_key() == key, "leadership kept changing after the restart"
    serving_leader = cluster.leader()
    assert serving_leader is not None and serving_leader.amqp_serves(2)
    for node in cluster.nodes:  # everyone else follows it
        if node is not serving_leader:
            wait_until(lambda n=node: f"following leader {serving_leader.node_id}" in n.log_text(), 5,
                       what=f"{node.name} to follow the leader")
