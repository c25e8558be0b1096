"""The MQTT connections of the broker: client ids per vhost (a second CONNECT with the same id takes
the session over) and the retained messages. No event loop here: the adapter drives connections."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from .connection import PROTOCOLS, MQTTConnection
from .connection5 import MQTT5Connection
from .exactly_once import QoS2Store
from .retained import RetainedStore
from .state5 import DelayedWill, publish_will, resume_wills, stop_wills
from .views import MQTTClientConnection

if TYPE_CHECKING:
    from ..broker.ops import Broker, VHost
    from ..config import Config


class MQTTSessions:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.config: Config = broker.config
        self.retained = RetainedStore(self.config.mqtt_retained_max_messages, self.config.mqtt_retained_max_bytes)
        self.qos2 = QoS2Store()
        self.connections: set[MQTTConnection] = set()
        self.clients: dict[tuple[str, str], MQTTConnection] = {}  # (vhost, client id) -> its connection
        self._tasks: set[asyncio.Task] = set()  # the loop keeps only weak references to its tasks
        for protocol in PROTOCOLS.values():  # in the metrics from the start, as AMQP's
            broker.node_counters.of(protocol)

    def new_connection(self, peer: tuple[str, int] | None, local: tuple[str, int] | None = None,
                       tls: bool = False) -> MQTTConnection:
        connection = MQTT5Connection(self, peer, local, tls)  # 3.1.1 or 5, as its CONNECT says
        self.connections.add(connection)
        self.broker.connections.register(connection, MQTTClientConnection(connection))
        self.broker.node_counters.connection_opened()  # churn counts every face's connections
        return connection

    def register(self, connection: MQTTConnection) -> None:
        """A client connected: one with the same id in the same vhost is disconnected first."""
        assert connection.vhost is not None
        key = (connection.vhost.name, connection.client_id)
        earlier = self.clients.get(key)
        if earlier is not None and earlier is not connection:
            earlier.kick(f"client id {connection.client_id!r} taken over by {connection.name}", 0x8E)
        self.clients[key] = connection

    def resume_wills(self) -> int:
        """At start: the delayed wills persistent sessions left before a stop or a crash wait again
        (or go out now, if due); how many."""
        counters = self.broker.node_counters.of(PROTOCOLS[5])
        exchange = self.config.mqtt_exchange
        resumed = 0
        for vhost in list(self.broker.vhosts.values()):
            def send(will: DelayedWill, vhost: VHost = vhost) -> None:
                publish_will(vhost, exchange, will, counters, self.retained)
            resumed += resume_wills(vhost, send)
        return resumed

    def start_task(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` on the running event loop."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def unregister(self, connection: MQTTConnection) -> None:
        if connection.vhost is not None:
            key = (connection.vhost.name, connection.client_id)
            if self.clients.get(key) is connection:
                del self.clients[key]

    def forget(self, connection: MQTTConnection) -> None:
        """The socket is gone."""
        if connection in self.connections:  # gone once, counted once
            self.connections.discard(connection)
            self.broker.connections.unregister(connection)
            self.broker.node_counters.connection_closed()

    # --- what the model asks of every face (the server's SessionLayers forwards it) ---------------
    def resources_changed(self, reason: str | None) -> None:
        """A resource alarm was raised or cleared: publishers stop being read, or are read again."""
        for connection in list(self.connections):
            connection.update_reading()

    def close_vhost_connections(self, vhost: str, reason: str) -> None:
        """The vhost goes away: its clients are disconnected now (no wills: there is nowhere to publish them)."""
        for connection in list(self.connections):
            if connection.vhost is not None and connection.vhost.name == vhost:
                connection.will = None
                connection.kick(reason)

    def shutdown(self) -> None:
        """The server stops: every client is disconnected (no wills: the broker, not the client, ends);
        delayed wills stay in their vhost's file, for the next start."""
        for connection in list(self.connections):
            connection.will = None
            connection.kick("the server is stopping", 0x8B)
        for vhost in list(self.broker.vhosts.values()):
            stop_wills(vhost)
