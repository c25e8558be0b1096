"""The cluster's etcd keys and the node info stored under them.

``<prefix>/leader``             the leader's clustering URI, bound to its lease
``<prefix>/isr``                JSON list of the in-sync node ids (written by the leader, fenced)
``<prefix>/isr_epoch``          the newest stream epoch every ISR member holds (written with the ISR)
``<prefix>/bootstrapped``       written with every ISR: this cluster has had a leader (the id of the last writer)
``<prefix>/force_leader``       a node id put by an operator: that node may lead whatever the ISR says
``<prefix>/clustering_secret``  hex of 32 random bytes, created once (replication authentication)
``<prefix>/nodes/<id>``         JSON NodeInfo of each live node, bound to its lease
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import re
import socket
from dataclasses import asdict, dataclass

from .etcd import KeyValue

_URI = re.compile(r"tcp://(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:/]+)):(?P<port>[0-9]+)")


def uri_host_port(uri: str) -> tuple[str, int]:
    """(host, port) of ``tcp://host:port`` (or ``tcp://[v6]:port``)."""
    match = _URI.fullmatch(uri)
    if match is None:
        raise ValueError(f"not a tcp://host:port address: {uri!r}")
    return match.group("v6") or match.group("host"), int(match.group("port"))


class ClusterKeys:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix.rstrip("/")
        self.leader = f"{self.prefix}/leader"
        self.isr = f"{self.prefix}/isr"
        self.isr_epoch = f"{self.prefix}/isr_epoch"
        self.bootstrapped = f"{self.prefix}/bootstrapped"
        self.force_leader = f"{self.prefix}/force_leader"
        self.secret = f"{self.prefix}/clustering_secret"
        self.nodes = f"{self.prefix}/nodes/"

    def node(self, node_id: str) -> str:
        return f"{self.nodes}{node_id}"


@dataclass(frozen=True)
class NodeInfo:
    """Where a node is reached: replication URI, AMQP, HTTP and MQTT host:port ("" = no HTTP, no
    MQTT); ``history``: its data dir had been part of a cluster when it joined (a replica state file)."""

    id: str
    uri: str
    amqp: str
    http: str
    history: bool = False
    mqtt: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_kv(cls, kv: KeyValue) -> NodeInfo | None:
        try:
            data = json.loads(kv.value)
            return cls(str(data["id"]), str(data["uri"]), str(data["amqp"]), str(data.get("http") or ""),
                       bool(data.get("history", False)), str(data.get("mqtt") or ""))
        except (ValueError, KeyError, TypeError):
            return None

    def hosts(self) -> set[str]:
        """The addresses this node connects from (its advertised ones)."""
        found = set()
        for address in (self.uri, f"tcp://{self.amqp}", f"tcp://{self.http}" if self.http else ""):
            try:
                found.add(uri_host_port(address)[0])
            except ValueError:
                continue
        return found


def normal_address(host: str) -> str:
    """One spelling per IP address (IPv4-mapped IPv6 as IPv4); other text unchanged."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


async def addresses_of(host: str) -> set[str]:
    """The IP addresses of an advertised host (itself when it is one; none when it does not resolve)."""
    normal = normal_address(host)
    if normal != host or ":" in host or host.replace(".", "").isdigit():
        return {normal}
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return set()
    return {normal_address(str(info[4][0])) for info in infos}


def isr_list(kv: KeyValue | None) -> list[str] | None:
    """The ISR key's node ids (None: absent or not a JSON list)."""
    if kv is None:
        return None
    try:
        members = json.loads(kv.value)
    except ValueError:
        return None
    return [str(m) for m in members] if isinstance(members, list) else None
