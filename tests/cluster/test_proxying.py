"""Followers forward AMQP and HTTP to the leader with a PROXY line; the leader trusts it from members only."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pika
import pytest
from e2e import assert_witness_served, rss_anon
from e2e.rawamqp import RawAMQP  # tests/ is on the path (no __init__.py there)
from pamqp import commands

from tests.helpers import connect_from, read_all, wait_until

from .harness import PREFIX, REPO_ROOT, Cluster

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"


def http_get(port: int, path: str, source: str | None = None) -> tuple[int, object]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={
        "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


@pytest.fixture(scope="module")
def three(module_cluster: Cluster):
    """Three nodes shared by the module's tests that only connect through them (none changes a node)."""
    cluster = module_cluster
    cluster.start(3)
    leader = cluster.wait_for_leader(30)
    followers = [n for n in cluster.nodes if n is not leader]
    for follower in followers:
        wait_until(lambda f=follower: f"following leader {leader.node_id}" in f.log_text(), 10,
                   what=f"{follower.name} to follow")
    return leader, followers


def test_publish_and_consume_through_a_follower_shows_the_real_client_address(three) -> None:
    leader, (follower, _) = three
    params = pika.ConnectionParameters("127.0.0.1", follower.amqp_port)
    connection = pika.BlockingConnection(params)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("through-follower", durable=True)
    for i in range(20):
        channel.basic_publish("", "through-follower", f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
    bodies = []
    for _ in range(20):
        method, _, body = channel.basic_get("through-follower", auto_ack=True)
        bodies.append(body)
    assert bodies == [f"m{i}".encode() for i in range(20)]
    connection.close()

    with RawAMQP("127.0.0.1", follower.amqp_port) as raw:  # a client whose address we know
        raw.handshake()
        client_port = raw.sock.getsockname()[1]
        status, connections = http_get(leader.http_port, "/api/connections")
        assert status == 200
        mine = [c for c in connections if c["peer_port"] == client_port]
        assert len(mine) == 1, connections
        assert mine[0]["peer_host"] == "127.0.0.1"
        assert mine[0]["port"] == follower.amqp_port  # the address the client connected to
        assert mine[0]["name"] == f"127.0.0.1:{client_port} -> 127.0.0.1:{follower.amqp_port}"


def _settled_rss_anon(pid: int, timeout: float = 10.0) -> int:
    """The process's RssAnon once it stops moving (two readings 0.25 s apart within 1 MiB): the follower
    also receives the backlog by replication, whose buffers are not what the test measures."""
    deadline = time.monotonic() + timeout
    last = rss_anon(pid)
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = rss_anon(pid)
        if abs(now - last) < 2**20:
            return now
        last = now
    return last


def test_a_consumer_that_never_reads_through_a_follower_does_not_grow_it(three) -> None:
    """The follower forwards no faster than the client reads: a 40 MiB backlog delivered to a client
    that reads nothing stays in the leader's queue and the sockets, not in the follower's memory, and
    the follower goes on forwarding for others."""
    leader, (follower, _) = three
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", leader.amqp_port))
    channel = connection.channel()
    channel.queue_declare("unread-backlog")
    for _ in range(160):
        channel.basic_publish("", "unread-backlog", b"u" * (256 * 1024))
    connection.close()
    before = _settled_rss_anon(follower.process.pid)  # after the backlog's replication to the follower
    with RawAMQP("127.0.0.1", follower.amqp_port) as slow:
        slow.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.handshake()
        slow.open_channel(1)
        slow.send(1, commands.Basic.Consume(queue="unread-backlog", no_ack=True, nowait=True))
        time.sleep(2.0)
        growth = rss_anon(follower.process.pid) - before
        assert_witness_served(f"amqp://guest:guest@127.0.0.1:{follower.amqp_port}/", 0.5)
    assert growth < 16 * 1024 * 1024, f"the follower's RssAnon grew by {growth / 2**20:.1f} MiB"


def test_http_through_a_follower_and_cluster_status(three) -> None:
    leader, followers = three
    def all_nodes() -> list | None:  # answered by the leader, which sees the nodes join within 0.5 s
        status, nodes = http_get(followers[0].http_port, "/api/nodes")
        assert status == 200
        return nodes if len(nodes) == 3 else None
    nodes = wait_until(all_nodes, 5, 0.2, "three nodes in /api/nodes")
    roles = {n["clustering_id"]: n["role"] for n in nodes}
    assert roles == {leader.node_id: "leader", **{f.node_id: "follower" for f in followers}}
    leader_entry = next(n for n in nodes if n["role"] == "leader")
    assert leader_entry["amqp_address"] == f"127.0.0.1:{leader.amqp_port}"
    assert "mem_used" in leader_entry  # the leader's own entry keeps RabbitMQ's node fields

    result = subprocess.run(
        [sys.executable, "-m", "lavinpy.cli.ctl", "--uri", f"http://guest:guest@127.0.0.1:{followers[1].http_port}",
         "cluster_status", "-f", "tsv"],
        capture_output=True, text=True, timeout=30, cwd=REPO_ROOT, env={"PYTHONPATH": str(REPO_ROOT)})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split("\t")[:2] == ["clustering_id", "role"]
    assert lines[1].split("\t")[:2] == [leader.node_id, "leader"]
    assert sorted(line.split("\t")[0] for line in lines[2:]) == sorted(f.node_id for f in followers)
    assert all(line.split("\t")[1] == "follower" for line in lines[2:])


def test_proxy_line_trusted_only_from_members(three) -> None:
    leader, _ = three
    line = b"PROXY TCP4 192.0.2.7 127.0.0.1 4242 5672\r\n"
    # 127.0.0.2 is no member's address: the line is bad input, answered as a bad protocol header.
    stranger = connect_from("127.0.0.2", leader.amqp_port)
    stranger.sendall(line + PROTOCOL_HEADER)
    assert read_all(stranger) == PROTOCOL_HEADER
    stranger.close()
    stranger = connect_from("127.0.0.2", leader.http_port)
    stranger.sendall(line + b"GET /api/overview HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_all(stranger).split(b"\r\n", 1)[0].endswith(b" 400 Bad Request")
    stranger.close()
    # From a member's address (127.0.0.1 here) the same line is taken: the handshake goes on.
    member = connect_from("127.0.0.1", leader.amqp_port)
    member.sendall(line + PROTOCOL_HEADER)
    assert member.recv(1) == b"\x01"  # connection.start
    member.close()
    # Over HTTP the request counts as coming from the line's client: guest is loopback-only, so a client
    # at 192.0.2.7 is refused and one at 127.0.0.1 is not.
    auth = b"Authorization: Basic " + base64.b64encode(b"guest:guest") + b"\r\n"
    request = b"GET /api/whoami HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + auth + b"\r\n"
    for source, status in ((b"192.0.2.7", b"401"), (b"127.0.0.1", b"200")):
        member = connect_from("127.0.0.1", leader.http_port)
        member.sendall(b"PROXY TCP4 " + source + b" 127.0.0.1 4242 15672\r\n" + request)
        assert read_all(member).split(b"\r\n", 1)[0] == b"HTTP/1.1 " + status + (b" OK" if status == b"200"
                                                                                   else b" Unauthorized")
        member.close()


def test_node_outside_the_isr_never_leads_and_refuses_clients_meanwhile(cluster: Cluster) -> None:
    cluster.etcd.etcdctl("put", f"{PREFIX}/isr", '["another-node"]')  # an ISR this node is not in
    (node,) = cluster.start(1)
    wait_until(lambda: "forwarding HTTP" in node.log_text(), 15, 0.1, "the node's client ports")
    time.sleep(1.0)  # several election rounds
    assert cluster.leader_key() is None
    client = socket.create_connection(("127.0.0.1", node.amqp_port), timeout=5)
    client.sendall(PROTOCOL_HEADER)
    # No leader to forward to: closed at once (a reset when the header arrives after the close).
    try:
        assert read_all(client) == b""
    except ConnectionResetError:
        pass
    client.close()
    status, body = http_get(node.http_port, "/api/overview")
    assert status == 503 and body["error"] == "service_unavailable"
    assert "no cluster leader is known" in node.log_text()

    cluster.etcd.etcdctl("del", f"{PREFIX}/isr")  # no ISR: any node may lead
    assert cluster.wait_for_leader(15) is node
