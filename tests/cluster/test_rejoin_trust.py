"""A follower whose lease ended (revoked in etcd here; expired after a pause or a partition alike) restarts,
registers again under a new lease and forwards its clients at once. The leader reads the members every
half second; a forwarded client that comes before that read must still be served, not refused for its
PROXY line, and nothing in the leader's log may blame ``proxy_protocol_trusted_sources``. A PROXY line
from an address no member has is still refused, logged as what it is: not a member's.

The leader runs on 127.0.0.3 and the follower on 127.0.0.1 (where its connections to the leader come
from), so the follower's own registration is what makes its PROXY lines trusted."""

from __future__ import annotations

import socket
import time

import pytest

from tests.helpers import read_all, wait_until

from .harness import PREFIX, Cluster, Node

pytestmark = pytest.mark.timeout(90)

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
WATCH_AFTER_SERVED = 1.5  # seconds of clients after the first one served: well past the members' poll


def _probe(node: Node) -> str:
    """One client through ``node``: "served" (Connection.Start came), "refused" (the protocol header came
    back: refused for a PROXY header) or "down" (not listening, no leader known yet, closed)."""
    try:
        with socket.create_connection((node.host, node.amqp_port), timeout=2) as sock:
            sock.sendall(PROTOCOL_HEADER)
            sock.settimeout(3)
            first = sock.recv(8)
    except OSError:
        return "down"
    if first.startswith(b"\x01"):
        return "served"
    if first.startswith(b"AMQP"):
        return "refused"
    return "down"


def _node_lease(cluster: Cluster, node: Node) -> int:
    key = cluster.etcd.get(f"{PREFIX}/nodes/{node.node_id}")
    return key[1] if key is not None else 0


def test_a_follower_registered_again_is_trusted_at_once(cluster: Cluster) -> None:
    try:
        socket.create_server(("127.0.0.3", 0)).close()
    except OSError:
        pytest.skip("this machine's loopback has no 127.0.0.3")
    leader = cluster.add(1, host="127.0.0.3")[0]
    leader.start()
    assert cluster.wait_for_leader(30) is leader
    follower = cluster.add(1)[0]
    follower.start()
    wait_until(lambda: _probe(follower) == "served", 30, 0.1, "a client served through the follower")
    old_lease = _node_lease(cluster, follower)
    assert old_lease
    logged = len(leader.log_text())

    cluster.etcd.call("lease/revoke", {"ID": old_lease})
    # The follower notices within a keepalive, restarts and registers under a new lease.
    wait_until(lambda: _node_lease(cluster, follower) not in (0, old_lease), 20, 0.005,
               "the follower registered again")
    seen: dict[str, int] = {"served": 0, "refused": 0, "down": 0}
    first_served = 0.0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        outcome = _probe(follower)
        seen[outcome] += 1
        if outcome == "served" and not first_served:
            first_served = time.monotonic()
        if first_served and time.monotonic() - first_served > WATCH_AFTER_SERVED:
            break
        if outcome == "down":
            time.sleep(0.005)
    assert first_served, f"no client served through the follower after it registered again: {seen}"
    assert seen["refused"] == 0, f"clients refused for their PROXY line after the follower came back: {seen}"
    blamed = [line for line in leader.log_text()[logged:].splitlines() if "PROXY" in line]
    assert not blamed, blamed

    # A PROXY line from an address no member has is still refused, and the log says why.
    with socket.socket() as stranger:
        stranger.bind(("127.0.0.2", 0))
        stranger.settimeout(5)
        stranger.connect((leader.host, leader.amqp_port))
        stranger.sendall(b"PROXY TCP4 203.0.113.9 127.0.0.3 5000 5672\r\n" + PROTOCOL_HEADER)
        assert read_all(stranger) == PROTOCOL_HEADER
    wait_until(lambda: "from 127.0.0.2" in leader.log_text()[logged:], 5, 0.05, "the refusal logged")
    refusal = next(line for line in leader.log_text()[logged:].splitlines() if "from 127.0.0.2" in line)
    assert "no cluster member's" in refusal and "proxy_protocol_trusted_sources" in refusal, refusal
