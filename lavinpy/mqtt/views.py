"""An MQTT connection as the model's connection registry holds it (``broker.connections``): its name,
its rows as the management API lists them (RabbitMQ's fields, ``protocol: "MQTT 3.1.1"``), its
session for its own page, and close. Who may see or close one is the model's rule
(``broker.ops.scope``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..broker.ops import ProtocolId, WindowRates
from .connection import PROTOCOLS
from .subscriptions import queue_name
from .subscriptions5 import Subscriptions5, shared_queue_name
from .topics import topic_filter

if TYPE_CHECKING:
    from .connection import MQTTConnection

DEFAULT_CLOSE_REASON = "closed via the management API"


def connection_name(conn: MQTTConnection) -> str:
    """RabbitMQ's connection name: ``peer_host:peer_port -> host:port``."""
    peer, local = conn.peer or ("", 0), conn.local or ("", 0)
    return f"{peer[0]}:{peer[1]} -> {local[0]}:{local[1]}"


def byte_rates(conn: MQTTConnection) -> tuple[float, float]:
    """Bytes received and sent per second, over the same window as an AMQP connection's."""
    if conn.byte_rates is None:  # as if made at the start: the first look averages since then
        conn.byte_rates = WindowRates((0, 0), now=conn.started)
    recv_rate, send_rate = conn.byte_rates.read((conn.recv_oct, conn.send_oct))
    return recv_rate, send_rate


def connection_info(conn: MQTTConnection, node: str) -> dict[str, Any]:
    peer, local = conn.peer or ("", 0), conn.local or ("", 0)
    recv_rate, send_rate = byte_rates(conn)
    return {
        "name": connection_name(conn), "node": node, "type": "network",
        "state": "blocked" if conn.reading_paused else "running",
        "protocol": PROTOCOLS[conn.protocol_level].name if conn.protocol_level in PROTOCOLS else "MQTT",
        "user": conn.username, "user_who_performed_action": conn.username,
        "vhost": conn.vhost.name if conn.vhost is not None else "",
        "channels": 0, "channel_max": 0, "frame_max": 0, "timeout": conn.keepalive,
        "peer_host": peer[0], "peer_port": peer[1], "host": local[0], "port": local[1], "ssl": conn.tls,
        "auth_mechanism": "none", "client_properties": {"client_id": conn.client_id},
        "auth_backend": conn.login_outcome.backend if conn.login_outcome is not None else "",
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
    subscriptions: list[dict[str, Any]] = []
    if exchange is not None:
        for binding in exchange.bindings():
            for qos, queue in queues.items():
                if queue is not None and binding.destination is queue:
                    name = topic_filter(binding.routing_key)
                    subscriptions.append({"topic_filter": name, "qos": 2 if qos and name in subs.qos2.filters else qos,
                                          "queue": queue.name})
    if isinstance(subs, Subscriptions5):  # MQTT 5: the shared subscriptions, and each filter's options
        for name, options in subs.options.items():
            if options.group is not None:
                subscriptions.append({"topic_filter": name, "qos": options.qos, "queue": shared_queue_name(
                    options.group, name.split("/", 2)[2])})
        for row in subscriptions:
            found = subs.options.get(str(row["topic_filter"]))
            if found is not None:
                row.update(no_local=found.no_local, retain_as_published=found.retain_as_published,
                           subscription_identifier=found.subscription_id)
    return {"client_id": conn.client_id, "clean_session": subs.clean_session,
            "subscriptions": sorted(subscriptions, key=lambda s: (s["topic_filter"], s["qos"])),
            "messages_unacknowledged": len(subs.inflight), "pubrel_pending": len(subs.qos2.pubrel_owed),
            "prefetch_count": subs.window}


def consumer_infos(conn: MQTTConnection, node: str) -> list[dict[str, Any]]:
    """The consumers of an MQTT client's subscription queues, as RabbitMQ lists consumers (an MQTT
    client has no channels: its connection stands in, channel number 0)."""
    subs = conn.subscriptions
    if subs is None or conn.closed or conn.vhost is None:
        return []
    name = connection_name(conn)
    peer = conn.peer or ("", 0)
    return [{
        "consumer_tag": consumer.tag,
        "queue": {"name": consumer.queue.name, "vhost": consumer.queue.vhost.name},
        "channel_details": {"name": name, "number": 0, "connection_name": name, "peer_host": peer[0],
                            "peer_port": peer[1], "user": conn.username, "node": node},
        "ack_required": not consumer.no_ack, "exclusive": False, "prefetch_count": consumer.prefetch,
        "active": True, "activity_status": "up", "arguments": {},
    } for consumer in list(subs.consumers.values())]


class MQTTClientConnection:
    """An MQTT connection in the model's registry (``broker.connections.ClientConnection``)."""

    __slots__ = ("conn",)

    def __init__(self, conn: MQTTConnection) -> None:
        self.conn = conn

    @property
    def protocol(self) -> ProtocolId:
        """By protocol level (a client not yet past CONNECT counts as MQTT 3.1.1)."""
        return PROTOCOLS.get(self.conn.protocol_level, PROTOCOLS[4])

    @property
    def listed(self) -> bool:
        conn = self.conn
        return conn.connected and not conn.closed and conn.vhost is not None

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
        return self.conn.peer or ("", 0)

    @property
    def client_info(self) -> dict[str, Any]:
        return {"client_id": self.conn.client_id}

    @property
    def channel_count(self) -> int:
        return 0  # an MQTT connection has no channels

    @property
    def publishers(self) -> int:
        return int(self.listed and self.conn.published)

    @property
    def consumer_count(self) -> int:
        subs = self.conn.subscriptions
        return len(subs.consumers) if subs is not None else 0

    def info(self, node: str) -> dict[str, Any]:
        return connection_info(self.conn, node)

    def details(self, node: str) -> dict[str, Any]:
        """With its MQTT session: subscriptions, deliveries awaiting PUBACK."""
        return {**connection_info(self.conn, node), "mqtt_session": session_info(self.conn)}

    def channel_infos(self, node: str) -> list[dict[str, Any]]:
        return []

    def consumer_infos(self, node: str) -> list[dict[str, Any]]:
        return consumer_infos(self.conn, node)

    def close(self, reason: str | None) -> None:
        """MQTT 3.1.1 has no close reason to send: the socket closes (MQTT 5 is sent DISCONNECT 0x98,
        administrative action, first)."""
        self.conn.kick(reason or DEFAULT_CLOSE_REASON)
