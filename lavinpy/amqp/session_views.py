"""An AMQP connection as the model's connection registry holds it (``broker.connections``): its
name, rows (the connection, its channels, its consumers) as RabbitMQ's API shows them, and close.

The session layer registers one ``AMQPClientConnection`` per connection from its start to its end;
the HTTP API and the metrics read them through the registry. What an actor may see and close is
the model's rule for every face (``broker.ops.scope``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..broker.ops import AMQP_091, ProtocolId
from ..wire.constants import CONNECTION_FORCED
from .connection import OPEN

if TYPE_CHECKING:
    from ..broker.ops import Consumer
    from .channel import Channel
    from .connection import AMQPConnection

PROTOCOL = AMQP_091.name
DEFAULT_CLOSE_REASON = "Closed via management plugin"


def _addresses(conn: AMQPConnection) -> tuple[str, int, str, int, bool]:
    """(peer host, peer port, local host, local port, TLS) from the connection's socket."""
    transport = getattr(conn.driver, "transport", None)
    peer = transport.get_extra_info("peername") if transport is not None else None
    local = transport.get_extra_info("sockname") if transport is not None else None
    ssl = transport is not None and transport.get_extra_info("ssl_object") is not None
    proxied = getattr(conn.driver, "proxied", None)  # forwarded by a cluster member: its client's addresses
    if proxied is not None:
        peer, local = proxied[0], proxied[1] or local
    peer_host, peer_port = (peer[0], peer[1]) if isinstance(peer, tuple) else ("", 0)
    host, port = (local[0], local[1]) if isinstance(local, tuple) else ("", 0)
    return peer_host, peer_port, host, port, ssl


def connection_name(conn: AMQPConnection) -> str:
    """RabbitMQ's connection name: ``peer_host:peer_port -> host:port``."""
    peer_host, peer_port, host, port, _ = _addresses(conn)
    return f"{peer_host}:{peer_port} -> {host}:{port}"


def connection_state(conn: AMQPConnection) -> str:
    """RabbitMQ's connection states under a resource alarm: ``blocking`` for a connection that has not
    published (it is still read: consumers ack, gets get), ``blocked`` for one that has (its input is
    no longer read). RabbitMQ reads a former publisher until its next publish and lavinpy stops it at
    once (a publish already read would be taken in), so a former publisher is ``blocked`` here at once."""
    if not conn.blocked:
        return "running"
    return "blocked" if conn.published else "blocking"


def connection_info(conn: AMQPConnection, node: str) -> dict[str, Any]:
    peer_host, peer_port, host, port, ssl = _addresses(conn)
    return {
        "name": f"{peer_host}:{peer_port} -> {host}:{port}",
        "node": node,
        "type": "network",
        "state": connection_state(conn),
        "protocol": PROTOCOL,
        "user": conn.username,
        "user_who_performed_action": conn.username,
        "vhost": conn.vhost.name if conn.vhost is not None else "",
        "channels": len(conn.channels),
        "channel_max": conn.channel_max,
        "frame_max": conn.frame_max,
        "timeout": conn.heartbeat,
        "peer_host": peer_host,
        "peer_port": peer_port,
        "host": host,
        "port": port,
        "ssl": ssl,
        "auth_mechanism": conn.auth_mechanism,
        "auth_backend": conn.login_outcome.backend if conn.login_outcome is not None else "",
        "client_properties": _jsonable(conn.client_properties),
        "connected_at": conn.connected_at,
        **byte_counters(conn),
        **tls_details(conn),
    }


def _distinguished_name(name: Any) -> str | None:
    # getpeercert()'s ((("commonName", "x"),), ...) as RabbitMQ prints a subject: "CN=x,O=y"
    short = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU", "countryName": "C",
             "localityName": "L", "stateOrProvinceName": "ST", "emailAddress": "emailAddress"}
    if not name:
        return None
    return ",".join(f"{short.get(k, k)}={v}" for rdn in name for k, v in rdn)


def tls_details(conn: AMQPConnection) -> dict[str, Any]:
    """RabbitMQ's TLS fields of a connection: null on plain TCP, the session's on TLS."""
    transport = getattr(conn.driver, "transport", None)
    tls = transport.get_extra_info("ssl_object") if transport is not None else None
    if tls is None:
        return {"ssl_protocol": None, "ssl_cipher": None, "peer_cert_subject": None, "peer_cert_issuer": None,
                "peer_cert_validity": None}
    cipher = tls.cipher()
    cert = tls.getpeercert() or {}
    validity = f"{cert['notBefore']} - {cert['notAfter']}" if "notAfter" in cert else None
    return {"ssl_protocol": (tls.version() or "").lower() or None, "ssl_cipher": cipher[0] if cipher else None,
            "peer_cert_subject": _distinguished_name(cert.get("subject")),
            "peer_cert_issuer": _distinguished_name(cert.get("issuer")), "peer_cert_validity": validity}


def byte_counters(conn: AMQPConnection) -> dict[str, Any]:
    """RabbitMQ's socket counters of a connection, the byte counts with their rates."""
    recv_rate, send_rate = conn.byte_rates.read((conn.recv_oct, conn.send_oct))
    return {"recv_oct": conn.recv_oct, "recv_oct_details": {"rate": recv_rate}, "recv_cnt": conn.recv_cnt,
            "send_oct": conn.send_oct, "send_oct_details": {"rate": send_rate}, "send_cnt": conn.send_cnt}


def _channel_name(conn_name: str, channel: Channel) -> str:
    return f"{conn_name} ({channel.id})"


def channel_info(conn: AMQPConnection, channel: Channel, node: str) -> dict[str, Any]:
    name = connection_name(conn)
    peer_host, peer_port, _, _, _ = _addresses(conn)
    confirms, tx = channel.confirms, channel.tx
    return {
        "name": _channel_name(name, channel),
        "node": node,
        "number": channel.id,
        "user": conn.username,
        "vhost": conn.vhost.name if conn.vhost is not None else "",
        "state": "running" if channel.flow_active else "flow",
        "confirm": confirms is not None,
        "transactional": tx is not None,
        "consumer_count": len(channel.consumers),
        "messages_unacknowledged": len(channel.deliveries.unacked),
        "messages_unconfirmed": confirms.unconfirmed if confirms is not None else 0,
        # what a transaction holds until tx.commit: publishes, and acks/rejects by delivery
        "messages_uncommitted": len(tx.publishes) if tx is not None else 0,
        "acks_uncommitted": tx.uncommitted_acks if tx is not None else 0,
        "prefetch_count": channel.prefetch_count,
        "global_prefetch_count": channel.deliveries.prefetch,
        "connection_details": {"name": name, "peer_host": peer_host, "peer_port": peer_port},
    }


def consumer_info(conn: AMQPConnection, channel: Channel, consumer: Consumer, node: str) -> dict[str, Any]:
    name = connection_name(conn)
    peer_host, peer_port, _, _, _ = _addresses(conn)
    queue = consumer.queue
    return {
        "consumer_tag": consumer.tag,
        "queue": {"name": queue.name, "vhost": queue.vhost.name},
        "channel_details": {"name": _channel_name(name, channel), "number": channel.id,
                            "connection_name": name, "peer_host": peer_host, "peer_port": peer_port,
                            "user": conn.username, "node": node},
        "ack_required": not consumer.no_ack,
        "exclusive": consumer.exclusive,
        "prefetch_count": consumer.prefetch,
        "active": True,
        "activity_status": "up",
        "arguments": _jsonable(consumer.arguments),
    }


def oldest_unacked_ages(connections: Iterable[AMQPConnection],
                        now: float | None = None) -> dict[tuple[str, str], float]:
    """(vhost, queue) -> seconds its oldest unacknowledged delivery has waited.

    Read from what the consumer-timeout sweep records for each channel's oldest delivery (first seen
    by a sweep, so within one sweep interval): no per-delivery timestamps on the hot path.
    """
    now = time.monotonic() if now is None else now
    ages: dict[tuple[str, str], float] = {}
    for conn in list(connections):
        for channel in list(conn.channels.values()):
            seen = channel.oldest_unacked_seen
            if seen is None:
                continue
            item = channel.deliveries.unacked.get(seen[0])
            if item is None:
                continue
            key = (item.queue.vhost.name, item.queue.name)
            ages[key] = max(ages.get(key, 0.0), now - seen[1])
    return ages


class AMQPClientConnection:
    """An AMQP connection in the model's registry (``broker.connections.ClientConnection``)."""

    __slots__ = ("conn",)
    protocol: ProtocolId = AMQP_091

    def __init__(self, conn: AMQPConnection) -> None:
        self.conn = conn

    @property
    def listed(self) -> bool:
        return self.conn.state == OPEN and self.conn.vhost is not None

    @property
    def name(self) -> str:
        return connection_name(self.conn)

    @property
    def vhost(self) -> str | None:
        vhost = self.conn.vhost
        return vhost.name if vhost is not None else None

    @property
    def user(self) -> str:
        return self.conn.username

    @property
    def peer(self) -> tuple[str, int]:
        peer_host, peer_port, _, _, _ = _addresses(self.conn)
        return peer_host, peer_port

    @property
    def client_info(self) -> dict[str, Any]:
        return dict(_jsonable(self.conn.client_properties) or {})

    @property
    def channel_count(self) -> int:
        return len(self.conn.channels)

    @property
    def publishers(self) -> int:
        return sum(channel.is_publisher for channel in list(self.conn.channels.values()))

    @property
    def consumer_count(self) -> int:
        return sum(len(channel.consumers) for channel in list(self.conn.channels.values()))

    def info(self, node: str) -> dict[str, Any]:
        return connection_info(self.conn, node)

    def details(self, node: str) -> dict[str, Any]:
        return connection_info(self.conn, node)

    def channel_infos(self, node: str) -> list[dict[str, Any]]:
        return [channel_info(self.conn, channel, node) for channel in list(self.conn.channels.values())]

    def consumer_infos(self, node: str) -> list[dict[str, Any]]:
        conn = self.conn
        return [consumer_info(conn, channel, consumer, node) for channel in list(conn.channels.values())
                for consumer in list(channel.consumers.values())]

    def close(self, reason: str | None) -> None:
        """With 320 CONNECTION_FORCED and ``reason`` (RabbitMQ's default text without one)."""
        self.conn.close(CONNECTION_FORCED, f"CONNECTION_FORCED - {reason or DEFAULT_CLOSE_REASON}")


def _jsonable(value: Any) -> Any:
    """Field-table values as JSON: bytes as text, nested tables and arrays walked."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
