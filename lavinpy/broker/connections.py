"""The client connections of every face, as the model knows them.

Each face registers its connections here when their socket opens and unregisters them when it
closes, each as a ``ClientConnection``: its name, vhost, user, protocol, peer and client info, the
rows the management API lists (the connection, its channels, its consumers) and ``close(reason)``.
The HTTP API, the metrics and lavinpyctl (through the API) read this registry, never a face; who
may see or close a connection is one rule (``broker.ops.scope``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from .metrics.stats import ProtocolId


@dataclass(frozen=True, slots=True)
class ConnectionCounts:
    """Client connections of one protocol (or of all of them, added up)."""

    sockets: int  # client sockets open, logged in or not (RabbitMQ's sockets_used)
    open: int  # connections past their login, the ones the API lists
    publishers: int = 0  # what RabbitMQ counts as publishers: AMQP channels, MQTT connections, that published
    consumers: int = 0

    def __add__(self, other: ConnectionCounts) -> ConnectionCounts:
        return ConnectionCounts(self.sockets + other.sockets, self.open + other.open,
                                self.publishers + other.publishers, self.consumers + other.consumers)


def all_protocols(counts: dict[str, ConnectionCounts]) -> ConnectionCounts:
    """The counts of every protocol added up."""
    return sum(counts.values(), ConnectionCounts(0, 0))


class ClientConnection(Protocol):
    """One client connection of some face, as the registry holds it."""

    @property
    def protocol(self) -> ProtocolId: ...

    @property
    def listed(self) -> bool:
        """Logged in and not closed: what the API lists (a socket still in its handshake is not)."""

    @property
    def name(self) -> str:
        """RabbitMQ's connection name, ``peer_host:peer_port -> host:port``: how the API names it."""

    @property
    def vhost(self) -> str | None: ...

    @property
    def user(self) -> str: ...

    @property
    def peer(self) -> tuple[str, int]: ...

    @property
    def client_info(self) -> dict[str, Any]:
        """What the client said of itself (AMQP client properties, an MQTT client id)."""

    @property
    def channel_count(self) -> int: ...

    @property
    def publishers(self) -> int:
        """What RabbitMQ counts as publishers on it: AMQP channels, an MQTT connection, that published."""

    @property
    def consumer_count(self) -> int: ...

    def info(self, node: str) -> dict[str, Any]:
        """The management API's row."""

    def details(self, node: str) -> dict[str, Any]:
        """The connection's own page: its row and what its protocol adds (an MQTT session)."""

    def channel_infos(self, node: str) -> list[dict[str, Any]]: ...

    def consumer_infos(self, node: str) -> list[dict[str, Any]]: ...

    def close(self, reason: str | None) -> None:
        """Closed through the API (``reason``: the X-Reason header, or None for the face's default)."""


class ConnectionRegistry:
    """Every face's open connections, in the order they connected."""

    def __init__(self) -> None:
        self._connections: dict[object, ClientConnection] = {}  # the face's own connection -> its entry

    def register(self, key: object, connection: ClientConnection) -> None:
        self._connections[key] = connection

    def unregister(self, key: object) -> None:
        self._connections.pop(key, None)

    def get(self, key: object) -> ClientConnection | None:
        """The registered connection of a face's connection object (an exclusive queue's owner), or None."""
        return self._connections.get(key)

    def owner_details(self, owner: object) -> dict[str, Any] | None:
        """RabbitMQ's ``owner_pid_details`` of an exclusive queue: its owning connection's name and peer
        (None when the owner is no registered connection)."""
        connection = self._connections.get(owner) if owner is not None else None
        if connection is None:
            return None
        peer_host, peer_port = connection.peer
        return {"name": connection.name, "peer_host": peer_host, "peer_port": peer_port}

    def all(self) -> list[ClientConnection]:
        """Every registered connection, listed or not (a copy)."""
        return list(self._connections.values())

    def listed(self, vhost: str | None = None) -> list[ClientConnection]:
        """The logged-in connections, optionally of one vhost."""
        return [c for c in list(self._connections.values()) if c.listed and (vhost is None or c.vhost == vhost)]

    def __len__(self) -> int:
        return len(self._connections)

    def counts(self) -> dict[str, ConnectionCounts]:
        """The connections by protocol, labelled as RabbitMQ's metrics label them (``amqp091``,
        ``mqtt311``): sockets (logged in or not), listed ones, publishers, consumers."""
        counts: dict[str, ConnectionCounts] = {}
        for c in list(self._connections.values()):
            label = c.protocol.label
            listed = c.listed
            add = ConnectionCounts(1, int(listed), c.publishers, c.consumer_count)
            counts[label] = counts[label] + add if label in counts else add
        return counts
