"""Shovels in a cluster run on the leader only, and a new leader takes them over after a failover."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pika

from tests.helpers import wait_until

from .harness import Cluster, Node
from .no_loss import isr

SHOVEL = {"src-uri": "amqp://", "src-queue": "sh-src", "dest-uri": "amqp://", "dest-queue": "sh-dst"}


def _kill_once_all_in_sync(cluster: Cluster, leader: Node) -> None:
    """Kill the leader once every node is in the ISR: a leader that dies while it is the only member
    leaves no node allowed to lead (by design: the others may lack what it confirmed)."""
    wait_until(lambda: len(isr(cluster.etcd)) == 3, 30, 0.1, "every node in the ISR")
    leader.kill()


def _put_shovel(node: Node) -> bool:
    """PUT the shovel through ``node``; False while the node answers 503 (a follower that knows no
    leader yet says so, with Retry-After) or does not listen yet (the leader may serve before a
    follower's process, started at the same time, has got as far as its HTTP port on a loaded machine)."""
    request = urllib.request.Request(node.http_url + "/api/parameters/shovel/%2F/moving", method="PUT",
                                     data=json.dumps({"value": SHOVEL}).encode(),
                                     headers={"content-type": "application/json",
                                              "authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})  # guest:guest
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert reply.status in (201, 204)
            return True
    except urllib.error.HTTPError as e:
        if e.code == 503:
            return False
        raise
    except urllib.error.URLError as e:
        if isinstance(e.reason, ConnectionRefusedError):
            return False
        raise


def _publish(node: Node, count: int) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(node.amqp_url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("sh-src", durable=True)
        for i in range(count):
            ch.basic_publish("", "sh-src", str(i).encode(), pika.BasicProperties(delivery_mode=2))
    finally:
        conn.close()


def _moved(node: Node) -> int:
    try:
        conn = pika.BlockingConnection(pika.URLParameters(node.amqp_url))
    except pika.exceptions.AMQPError:
        return -1  # between leaders
    try:
        return conn.channel().queue_declare("sh-dst", durable=True).method.message_count
    finally:
        conn.close()


def _runs_shovel(node: Node) -> bool:
    return "shovel moving in vhost / running" in node.log_text()


def test_only_the_leader_shovels_and_a_new_leader_takes_over(cluster: Cluster) -> None:
    # The bounds are for a loaded machine (three nodes starting at once on two shared cores): what is
    # checked is where the shovel runs and what it moves, not how soon a leader is elected.
    nodes = cluster.start(3)
    leader = cluster.wait_for_leader(60)
    followers = [n for n in nodes if n is not leader]
    _publish(leader, 100)
    # through a follower's HTTP port: forwarded to the leader once the follower knows it
    wait_until(lambda: _put_shovel(followers[0]), 60, interval=0.5, what="a follower to forward the shovel's PUT")
    wait_until(lambda: _moved(leader) == 100, 20, what="the shovel to move 100 messages")
    assert _runs_shovel(leader)
    assert not any(_runs_shovel(f) for f in followers)

    _kill_once_all_in_sync(cluster, leader)
    successor = cluster.wait_for_leader(60, exclude=leader)
    wait_until(lambda: _runs_shovel(successor), 60, what="the new leader to run the shovel")
    _publish(successor, 50)
    # at least the 150 (a move unconfirmed at the kill may be repeated), and the source drained
    wait_until(lambda: _moved(successor) >= 150, 20, what="the new leader's shovel to move the new messages")
    assert [f for f in followers if f is not successor and _runs_shovel(f)] == []
    # The parameter came with the user who set it (it runs as guest there too, with no password).
    request = urllib.request.Request(successor.http_url + "/api/parameters/shovel/%2F/moving",
                                     headers={"authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
    with urllib.request.urlopen(request, timeout=10) as reply:
        assert json.load(reply)["user"] == "guest"


def _shovel_state(node: Node) -> str | None:
    request = urllib.request.Request(node.http_url + "/api/shovels/vhost/%2F/moving",
                                     headers={"authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return json.load(reply)["state"]
    except OSError:
        return None  # between leaders


def test_a_paused_shovel_stays_paused_on_a_new_leader(cluster: Cluster) -> None:
    """The pause is stored with the shovel's parameter, replicated as it is: a new leader keeps the shovel
    paused until it is resumed."""
    cluster.start(3)
    leader = cluster.wait_for_leader(60)
    _publish(leader, 0)  # its source queue
    assert _put_shovel(leader)
    wait_until(lambda: _runs_shovel(leader), 20, what="the shovel running")
    request = urllib.request.Request(leader.http_url + "/api/shovels/%2F/moving/pause", method="PUT",
                                     headers={"authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
    with urllib.request.urlopen(request, timeout=10) as reply:
        assert reply.status == 204
    _publish(leader, 20)  # confirmed: replicated, and the pause mark before it
    _kill_once_all_in_sync(cluster, leader)
    successor = cluster.wait_for_leader(60, exclude=leader)
    wait_until(lambda: _shovel_state(successor) == "paused", 20, what="the new leader to list it paused")
    assert _moved(successor) == 0 and not _runs_shovel(successor)
    request = urllib.request.Request(successor.http_url + "/api/shovels/%2F/moving/resume", method="PUT",
                                     headers={"authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
    with urllib.request.urlopen(request, timeout=10) as reply:
        assert reply.status == 204
    wait_until(lambda: _moved(successor) == 20, 20, what="the resumed shovel to move the 20")
