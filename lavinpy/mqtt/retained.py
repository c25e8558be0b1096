"""Retained messages, one per topic per vhost, delivered on SUBSCRIBE with the retain flag.

Kept in memory and in a file of the vhost's own (``mqtt.retained``, through ``VHost.append_file``): a
record per retained publish or clear, appended as the store's other files are written, so it is
replicated to the cluster's followers with them and synced by the store's group commit (``always``:
the PUBACK waits for the flush, as a confirm does; ``batch``: the flush on the batch timer), read back
at the first use after a start (a torn last record, from a crash mid-write, is dropped), and rewritten
whole once it holds mostly replaced records."""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING

from ..logs import RateLimitedLog
from . import topics

if TYPE_CHECKING:
    from ..broker.vhost import VHost

log = logging.getLogger("lavinpy.mqtt")
refused_log = RateLimitedLog(log)  # one line per refused retained message, a bounded number per interval

FILE_NAME = "mqtt.retained"
_SET, _CLEAR = b"R", b"D"
COMPACT_MIN_BYTES = 1 << 20  # below this the file is never rewritten


def _record(topic: str, payload: bytes | None, qos: int) -> bytes:
    name = topic.encode("utf-8")
    head = len(name).to_bytes(2, "big") + name
    if payload is None:
        return _CLEAR + head
    return _SET + head + bytes((qos,)) + len(payload).to_bytes(4, "big") + payload


def _size(topic: str, payload: bytes) -> int:
    """The length of a retained message's record."""
    return 8 + len(topic.encode("utf-8")) + len(payload)


def _parse(data: bytes, name: str) -> tuple[dict[str, tuple[bytes, int]], int]:
    """The retained messages a file holds, and the length of its whole records."""
    messages: dict[str, tuple[bytes, int]] = {}
    pos, end = 0, len(data)
    while pos + 3 <= end:
        kind = data[pos:pos + 1]
        size = int.from_bytes(data[pos + 1:pos + 3], "big")
        start = pos + 3 + size
        if start > end or kind not in (_SET, _CLEAR):
            break
        topic = data[pos + 3:start].decode("utf-8", "replace")
        if kind == _CLEAR:
            messages.pop(topic, None)
            pos = start
            continue
        if start + 5 > end:
            break
        qos = data[start]
        length = int.from_bytes(data[start + 1:start + 5], "big")
        if start + 5 + length > end:
            break
        messages[topic] = (data[start + 5:start + 5 + length], qos)
        pos = start + 5 + length
    if pos != end:
        log.warning("%s: %d bytes of a torn last record dropped", name, end - pos)
    return messages, pos


class VHostRetained:
    """One vhost's retained messages and their file, at most ``max_messages`` of at most ``max_bytes``
    (their records' size)."""

    def __init__(self, vhost: VHost, max_messages: int, max_bytes: int) -> None:
        self.vhost_name = vhost.name
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.file = vhost.append_file(FILE_NAME)
        data = self.file.open()
        self.messages, self.file_bytes = _parse(data, str(self.file.path))
        self.live_bytes = sum(_size(t, p) for t, (p, _) in self.messages.items())  # their records' size
        if len(data) != self.file_bytes:
            self.file.truncate(self.file_bytes)

    def put(self, topic: str, payload: bytes, qos: int) -> bool:
        """Whether the change waits for ``vhost.durable()`` to be on disk (and on the followers)."""
        old = self.messages.get(topic)
        if payload and not self._room(topic, payload, old):
            return False
        if payload:
            self.messages[topic] = (payload, qos)
            self.live_bytes += _size(topic, payload)
        elif old is None:
            return False  # nothing retained to clear
        else:
            del self.messages[topic]
        if old is not None:
            self.live_bytes -= _size(topic, old[0])
        if self.file_bytes > COMPACT_MIN_BYTES and self.file_bytes > 2 * self.live_bytes:
            data = b"".join(_record(t, p, q) for t, (p, q) in self.messages.items())
            self.file_bytes = len(data)
            return self.file.replace(data)
        record = _record(topic, payload or None, qos)
        self.file_bytes += len(record)
        return self.file.append(record)


    def _room(self, topic: str, payload: bytes, old: tuple[bytes, int] | None) -> bool:
        """Whether the message fits the vhost's limits (a replaced one's room counts); else a log line."""
        freed = _size(topic, old[0]) if old is not None else 0
        count = len(self.messages) + (old is None)
        if count <= self.max_messages and self.live_bytes - freed + _size(topic, payload) <= self.max_bytes:
            return True
        refused_log.log(logging.WARNING, "vhost %r: retained message on %r (%d bytes) not retained: over "
                        "mqtt_retained_max_messages %d or mqtt_retained_max_bytes %d", self.vhost_name, topic,
                        len(payload), self.max_messages, self.max_bytes)
        return False

    def topics(self, topic_filter: str) -> list[str]:
        """The topics with a retained message the filter matches."""
        return [topic for topic in self.messages if topics.matches(topic_filter, topic)]

    def get(self, topic: str) -> tuple[bytes, int] | None:
        """A topic's retained (payload, qos), if it still has one."""
        return self.messages.get(topic)


class RetainedStore:
    """Every vhost's retained messages (a vhost deleted and made again starts empty: its directory went)."""

    def __init__(self, max_messages: int = 100_000, max_bytes: int = 1 << 30) -> None:
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._by_vhost: weakref.WeakKeyDictionary[VHost, VHostRetained] = weakref.WeakKeyDictionary()

    def of(self, vhost: VHost) -> VHostRetained:
        retained = self._by_vhost.get(vhost)
        if retained is None:
            retained = self._by_vhost[vhost] = VHostRetained(vhost, self.max_messages, self.max_bytes)
        return retained

    def put(self, vhost: VHost, topic: str, payload: bytes, qos: int) -> bool:
        """A retained publish: kept for the topic; an empty payload clears it (the spec's rule). Whether
        a PUBACK waits for ``vhost.durable()``."""
        return self.of(vhost).put(topic, payload, qos)

    def matching(self, vhost: VHost, topic_filter: str) -> list[tuple[str, bytes, int]]:
        """(topic, payload, qos) of every retained message the filter matches."""
        retained = self.of(vhost)
        return [(topic, *retained.messages[topic]) for topic in retained.topics(topic_filter)]
