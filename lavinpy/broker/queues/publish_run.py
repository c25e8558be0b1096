"""A run of published messages that share exchange and routing key, and properties or not (a leaf: the queues
take runs and the publishing code makes them, neither needs the other to name the type)."""

from __future__ import annotations

from ...store.record import StoredMessage, stored_messages


class PublishRun:
    """A run of messages published with the same exchange and routing key.

    ``properties`` is the one block all share (the common case, stored as is), or a list with one
    block per body when they differ in properties that do not route (ids, timestamps, headers).
    ``message(i)`` is the record of ``bodies[i]`` as a queue hands it to a consumer; it is built only
    for messages delivered in hand.
    """

    __slots__ = ("exchange", "routing_key", "properties", "bodies", "timestamp")

    def __init__(self, exchange: str, routing_key: str, properties: bytes | list[bytes], bodies: list[bytes],
                 timestamp: int) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.properties = properties
        self.bodies = bodies
        self.timestamp = timestamp

    def message(self, i: int) -> StoredMessage:
        properties = self.properties
        return StoredMessage(self.timestamp, self.exchange, self.routing_key,
                             properties[i] if isinstance(properties, list) else properties, self.bodies[i])

    def messages(self, start: int, count: int) -> list[StoredMessage]:
        """``message(i)`` for ``start <= i < start + count``, built in one call."""
        return stored_messages(self.timestamp, self.exchange, self.routing_key, self.properties, self.bodies,
                               start, count)
