"""Retained messages, one per topic per vhost, delivered on SUBSCRIBE with the retain flag.

Kept in a file of the vhost's own (``mqtt.retained``, through ``VHost.append_file``) with only an index
in memory (topic -> where its payload lies in the file, its length and QoS): a payload is read from the
file when it is sent. A record per retained publish or clear is appended as the store's other files
are written, so it is replicated to the cluster's followers with them and synced by the store's group
commit (``always``: the PUBACK waits for the flush, as a confirm does; ``batch``: the flush on the batch
timer). The index is rebuilt at the first use after a start by reading the records' headers a chunk at a
time (a torn last record, from a crash mid-write, is dropped), and the file is rewritten record by
record once it holds mostly replaced ones. Each vhost holds at most ``mqtt_retained_max_messages``
messages of at most ``mqtt_retained_max_bytes`` (their records' size); a retained publish beyond is
not retained (it is still delivered), with a log line.

An MQTT 5 publisher's message keeps the AMQP properties it was published with (its user properties,
content type, response topic, correlation data, payload format, expiry) and when it came, ahead of its
payload in the record (a flag in the QoS byte says so): a subscriber gets it with those properties,
and with what is left of its Message Expiry Interval, or not at all once that has passed."""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from ..logs import RateLimitedLog
from . import topics
from .message5 import Outbound
from .subscriber_host import RetainedMessage

if TYPE_CHECKING:
    from ..broker.ops import VHost

log = logging.getLogger("lavinpy.mqtt")
refused_log = RateLimitedLog(log)  # one line per refused retained message, a bounded number per interval

FILE_NAME = "mqtt.retained"
_SET, _CLEAR = b"R", b"D"
COMPACT_MIN_BYTES = 1 << 20  # below this the file is never rewritten
_CHUNK = 1 << 20  # payload bytes copied at a time when the file is rewritten
_WINDOW = 1 << 16  # bytes of records' headers read at a time when the index is rebuilt
_WITH_PROPERTIES = 0x80  # in a record's QoS byte: its properties and time come before the payload


def _stored(payload: bytes, properties: bytes | None, timestamp_ms: int) -> bytes:
    """What a record keeps after its header: the payload, after the properties and the time if any."""
    if properties is None:
        return payload
    return len(properties).to_bytes(4, "big") + properties + timestamp_ms.to_bytes(8, "big") + payload


def _message(stored: bytes, flags: int) -> RetainedMessage:
    if not flags & _WITH_PROPERTIES:
        return RetainedMessage(stored, flags, None, 0)
    size = int.from_bytes(stored[:4], "big")
    timestamp = int.from_bytes(stored[4 + size:12 + size], "big")
    return RetainedMessage(stored[12 + size:], flags & 3, stored[4:4 + size], timestamp)


def _header(topic: str, qos: int, length: int) -> bytes:
    """A retained message's record before its payload of ``length`` bytes."""
    name = topic.encode("utf-8")
    return _SET + len(name).to_bytes(2, "big") + name + bytes((qos,)) + length.to_bytes(4, "big")


def _record(topic: str, payload: bytes | None, qos: int) -> bytes:
    if payload is None:
        name = topic.encode("utf-8")
        return _CLEAR + len(name).to_bytes(2, "big") + name
    return _header(topic, qos, len(payload)) + payload


def _size(topic: str, length: int) -> int:
    """The length of a retained message's record, by its payload's length."""
    return 8 + len(topic.encode("utf-8")) + length


Entry = tuple[int, int, int]  # (the payload's offset in the file, its length, the QoS)


def _scan(read_at: Callable[[int, int], bytes], end: int) -> tuple[dict[str, Entry], int]:
    """The index of the records in the first ``end`` bytes (read a chunk at a time, payloads skipped)
    and the length of the whole records."""
    index: dict[str, Entry] = {}
    buf, buf_at = b"", 0  # a window of the file

    def window(pos: int, size: int) -> bytes | None:
        nonlocal buf, buf_at
        if pos + size > end:
            return None
        if not (buf_at <= pos and pos + size <= buf_at + len(buf)):
            buf, buf_at = read_at(pos, max(size, _WINDOW)), pos
        return buf[pos - buf_at:pos - buf_at + size]

    pos = 0
    while True:
        head = window(pos, 3)
        if head is None or head[:1] not in (_SET, _CLEAR):
            break
        size = int.from_bytes(head[1:3], "big")
        name = window(pos + 3, size)
        if name is None:
            break
        topic = name.decode("utf-8", "replace")
        start = pos + 3 + size
        if head[:1] == _CLEAR:
            index.pop(topic, None)
            pos = start
            continue
        fields = window(start, 5)
        if fields is None:
            break
        length = int.from_bytes(fields[1:5], "big")
        if start + 5 + length > end:
            break
        index[topic] = (start + 5, length, fields[0])
        pos = start + 5 + length
    return index, pos


def _parse(data: bytes, name: str) -> tuple[dict[str, RetainedMessage], int]:
    """The retained messages a file's bytes hold, and the length of its whole records."""
    index, end = _scan(lambda offset, size: data[offset:offset + size], len(data))
    if end != len(data):
        log.warning("%s: %d bytes of a torn last record dropped", name, len(data) - end)
    return {topic: _message(data[at:at + length], flags) for topic, (at, length, flags) in index.items()}, end


class VHostRetained:
    """One vhost's retained messages: the index in memory, the payloads in the file."""

    def __init__(self, vhost: VHost, max_messages: int, max_bytes: int) -> None:
        self.vhost_name = vhost.name
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.file = vhost.append_file(FILE_NAME)
        size = self.file.open_unread()
        self.index, self.file_bytes = _scan(self.file.read_at, size)
        if size != self.file_bytes:
            log.warning("%s: %d bytes of a torn last record dropped", self.file.path, size - self.file_bytes)
            self.file.truncate(self.file_bytes)
        self.live_bytes = sum(_size(t, length) for t, (_, length, _) in self.index.items())  # their records' size

    def put(self, topic: str, payload: bytes, qos: int, properties: bytes | None = None,
            timestamp_ms: int | None = None) -> bool:
        """Whether the change waits for ``vhost.durable()`` to be on disk (and on the followers)."""
        old = self.index.get(topic)
        if timestamp_ms is None:
            timestamp_ms = time.time_ns() // 1_000_000
        stored = _stored(payload, properties, timestamp_ms) if payload else payload
        if properties is not None:
            qos |= _WITH_PROPERTIES
        if payload and not self._room(topic, len(stored), old):
            return False
        if not payload:
            if old is None:
                return False  # nothing retained to clear
            del self.index[topic]
        if old is not None:
            self.live_bytes -= _size(topic, old[1])
        if payload:
            self.live_bytes += _size(topic, len(stored))
        record = _record(topic, stored or None, qos)
        if payload:
            self.index[topic] = (self.file_bytes + len(record) - len(stored), len(stored), qos)
        self.file_bytes += len(record)
        waits = self.file.append(record)
        if self.file_bytes > COMPACT_MIN_BYTES and self.file_bytes > 2 * self.live_bytes:
            return self._compact() or waits
        return waits

    def _compact(self) -> bool:
        """Rewrite the file with the live records only, a record at a time."""
        index: dict[str, Entry] = {}
        written = 0

        def records() -> Iterator[bytes]:
            nonlocal written
            for topic, (at, length, qos) in self.index.items():
                head = _header(topic, qos, length)
                index[topic] = (written + len(head), length, qos)
                written += len(head) + length
                yield head
                for offset in range(0, length, _CHUNK):
                    yield self.file.read_at(at + offset, min(_CHUNK, length - offset))

        waits = self.file.replace_from(records())
        self.index, self.file_bytes = index, written
        return waits

    def _room(self, topic: str, length: int, old: Entry | None) -> bool:
        """Whether the message fits the vhost's limits (a replaced one's room counts); else a log line."""
        freed = _size(topic, old[1]) if old is not None else 0
        count = len(self.index) + (old is None)
        if count <= self.max_messages and self.live_bytes - freed + _size(topic, length) <= self.max_bytes:
            return True
        refused_log.log(logging.WARNING, "vhost %r: retained message on %r (%d bytes) not retained: over "
                        "mqtt_retained_max_messages %d or mqtt_retained_max_bytes %d", self.vhost_name, topic,
                        length, self.max_messages, self.max_bytes)
        return False

    def topics(self, topic_filter: str) -> list[str]:
        """The topics with a retained message the filter matches."""
        return [topic for topic in self.index if topics.matches(topic_filter, topic)]

    def get(self, topic: str) -> RetainedMessage | None:
        """A topic's retained message, read from the file, if it still has one whose Message Expiry
        Interval (its AMQP expiration, read as an MQTT 5 delivery reads it) has not passed."""
        entry = self.index.get(topic)
        if entry is None:
            return None
        at, length, flags = entry
        message = _message(self.file.read_at(at, length), flags)
        if message.properties is not None:
            expiration = Outbound(message.properties).expiration_ms
            if expiration is not None and time.time_ns() // 1_000_000 - message.timestamp_ms >= expiration:
                return None
        return message


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

    def put(self, vhost: VHost, topic: str, payload: bytes, qos: int, properties: bytes | None = None,
            timestamp_ms: int | None = None) -> bool:
        """A retained publish (``properties``: its AMQP ones, kept with its time, now unless given):
        kept for the topic; an empty payload clears it (the spec's rule). Whether a PUBACK waits for
        ``vhost.durable()``."""
        return self.of(vhost).put(topic, payload, qos, properties, timestamp_ms)

    def matching(self, vhost: VHost, topic_filter: str) -> list[tuple[str, bytes, int]]:
        """(topic, payload, qos) of every retained message the filter matches."""
        retained = self.of(vhost)
        return [(topic, found.payload, found.qos) for topic in retained.topics(topic_filter)
                if (found := retained.get(topic)) is not None]
