"""Retained messages, one per topic per vhost, delivered on SUBSCRIBE with the retain flag.

Kept in memory in this first version: they do not survive a restart (the durable per-vhost store
is still to come)."""

from __future__ import annotations

from . import topics


class RetainedStore:
    def __init__(self) -> None:
        self._by_vhost: dict[str, dict[str, tuple[bytes, int]]] = {}

    def put(self, vhost: str, topic: str, payload: bytes, qos: int) -> None:
        """A retained publish: kept for the topic; an empty payload clears it (the spec's rule)."""
        messages = self._by_vhost.setdefault(vhost, {})
        if payload:
            messages[topic] = (payload, qos)
        else:
            messages.pop(topic, None)

    def matching(self, vhost: str, topic_filter: str) -> list[tuple[str, bytes, int]]:
        """(topic, payload, qos) of every retained message the filter matches."""
        messages = self._by_vhost.get(vhost, {})
        return [(topic, payload, qos) for topic, (payload, qos) in messages.items()
                if topics.matches(topic_filter, topic)]

    def drop_vhost(self, vhost: str) -> None:
        self._by_vhost.pop(vhost, None)
