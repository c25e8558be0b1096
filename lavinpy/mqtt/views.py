"""MQTT connections as the management API lists them (RabbitMQ's fields, ``protocol: "MQTT 3.1.1"``),
found by name and closed; who may see or close one is the model's rule (``broker.operations``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..broker.operations import can_see_connection, can_see_vhost, check_close_connection
from ..wire.constants import NOT_FOUND
from ..wire.errors import AMQPChannelError
from .subscriptions import queue_name
from .topics import topic_filter

if TYPE_CHECKING:
    from ..broker.actor import Actor
    from .connection import MQTTConnection
    from .sessions import MQTTSessions

PROTOCOLS = {4: "MQTT 3.1.1", 3: "MQTT 3.1"}


def connection_name(conn: MQTTConnection) -> str:
    """RabbitMQ's connection name: ``peer_host:peer_port -> host:port``."""
    peer, local = conn.peer or ("", 0), conn.local or ("", 0)
    return f"{peer[0]}:{peer[1]} -> {local[0]}:{local[1]}"


def open_connections(sessions: MQTTSessions, actor: Actor | None, vhost: str | None = None) -> list[MQTTConnection]:
    """Logged-in MQTT connections the actor may see, optionally of one vhost."""
    return [c for c in list(sessions.connections)
            if c.connected and not c.closed and c.vhost is not None and (vhost is None or c.vhost.name == vhost)
            and can_see_connection(actor, c.username)]


def connection_info(conn: MQTTConnection, node: str) -> dict[str, Any]:
    peer, local = conn.peer or ("", 0), conn.local or ("", 0)
    recv_rate, send_rate = conn.byte_rates()
    return {
        "name": connection_name(conn), "node": node, "type": "network",
        "state": "blocked" if conn.reading_paused else "running",
        "protocol": PROTOCOLS.get(conn.protocol_level, "MQTT"),
        "user": conn.username, "user_who_performed_action": conn.username,
        "vhost": conn.vhost.name if conn.vhost is not None else "",
        "channels": 0, "channel_max": 0, "frame_max": 0, "timeout": conn.keepalive,
        "peer_host": peer[0], "peer_port": peer[1], "host": local[0], "port": local[1], "ssl": conn.tls,
        "auth_mechanism": "none", "client_properties": {"client_id": conn.client_id},
        "connected_at": conn.connected_at,
        # The socket counters and byte rates AMQP rows have (the same window rates).
        "recv_oct": conn.recv_oct, "recv_oct_details": {"rate": recv_rate}, "recv_cnt": conn.recv_cnt,
        "send_oct": conn.send_oct, "send_oct_details": {"rate": send_rate}, "send_cnt": conn.send_cnt,
        "ssl_protocol": None, "ssl_cipher": None, "peer_cert_subject": None, "peer_cert_issuer": None,
        "peer_cert_validity": None,
    }


def session_info(conn: MQTTConnection) -> dict[str, Any]:
    """The client's MQTT session, for one connection's page: its subscriptions (read from the
    bindings of its queues on the MQTT exchange; QoS 2 for a filter the session granted it), the QoS 1
    and 2 deliveries awaiting PUBACK or PUBREC, and the QoS 2 PUBRELs awaiting PUBCOMP."""
    subs = conn.subscriptions
    if subs is None or conn.vhost is None:
        return {"client_id": conn.client_id, "clean_session": None, "subscriptions": [], "messages_unacknowledged": 0,
                "pubrel_pending": 0}
    queues = {qos: conn.vhost.queues.get(queue_name(conn.client_id, qos)) for qos in (0, 1)}
    exchange = conn.vhost.exchanges.get(subs.exchange)
    subscriptions = []
    if exchange is not None:
        for binding in exchange.bindings():
            for qos, queue in queues.items():
                if queue is not None and binding.destination is queue:
                    name = topic_filter(binding.routing_key)
                    subscriptions.append({"topic_filter": name, "qos": 2 if qos and name in subs.qos2.filters else qos,
                                          "queue": queue.name})
    return {"client_id": conn.client_id, "clean_session": subs.clean_session,
            "subscriptions": sorted(subscriptions, key=lambda s: (s["topic_filter"], s["qos"])),
            "messages_unacknowledged": len(subs.inflight), "pubrel_pending": len(subs.qos2.pubrel_owed),
            "prefetch_count": subs.window}


def consumer_infos(sessions: MQTTSessions, actor: Actor | None, node: str,
                   vhost: str | None = None) -> list[dict[str, Any]]:
    """The consumers of MQTT clients' subscription queues, as RabbitMQ lists consumers (an MQTT
    client has no channels: its connection stands in, channel number 0)."""
    infos = []
    for conn in list(sessions.connections):
        subs = conn.subscriptions
        if (subs is None or conn.closed or conn.vhost is None or (vhost is not None and conn.vhost.name != vhost)
                or not can_see_vhost(actor, conn.vhost.name)):
            continue
        name = connection_name(conn)
        peer = conn.peer or ("", 0)
        for consumer in list(subs.consumers.values()):
            infos.append({
                "consumer_tag": consumer.tag,
                "queue": {"name": consumer.queue.name, "vhost": consumer.queue.vhost.name},
                "channel_details": {"name": name, "number": 0, "connection_name": name, "peer_host": peer[0],
                                    "peer_port": peer[1], "user": conn.username, "node": node},
                "ack_required": not consumer.no_ack, "exclusive": False, "prefetch_count": consumer.prefetch,
                "active": True, "activity_status": "up", "arguments": {},
            })
    return infos


def find_connection(sessions: MQTTSessions, actor: Actor | None, name: str) -> MQTTConnection:
    for conn in open_connections(sessions, actor):
        if connection_name(conn) == name:
            return conn
    raise AMQPChannelError(NOT_FOUND, f"no connection '{name}'")


def close_connection(sessions: MQTTSessions, actor: Actor | None, name: str, reason: str | None) -> None:
    """Close an MQTT connection (MQTT 3.1.1 has no close reason to send: the socket closes)."""
    conn = find_connection(sessions, actor, name)
    check_close_connection(actor, conn.username, name)
    conn.kick(reason or "closed via the management API")
