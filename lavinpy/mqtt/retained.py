"""Retained messages, one per topic per vhost, delivered on SUBSCRIBE with the retain flag.

Kept in memory and in an append-only file in the vhost's directory (``mqtt.retained``): a record
per retained publish or clear, synced before the PUBACK when the fsync policy is ``always``, read
back at the first use after a start (a torn last record, from a crash mid-write, is dropped), and
rewritten whole once it holds mostly replaced records."""

from __future__ import annotations

import logging
import os
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

from . import topics

if TYPE_CHECKING:
    from ..broker.vhost import VHost

log = logging.getLogger("lavinpy.mqtt")

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


def _read(path: Path) -> tuple[dict[str, tuple[bytes, int]], int]:
    """The retained messages a file holds, and the length of its whole records."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}, 0
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
        log.warning("%s: %d bytes of a torn last record dropped", path, end - pos)
    return messages, pos


class _VHostRetained:
    """One vhost's retained messages and their file."""

    def __init__(self, vhost: VHost) -> None:
        self.path = vhost.path / FILE_NAME
        self.sync = vhost.config.fsync == "always"
        self.messages, self.file_bytes = _read(self.path)
        self.live_bytes = sum(_size(t, p) for t, (p, _) in self.messages.items())  # their records' size
        if self.path.exists() and self.path.stat().st_size != self.file_bytes:
            os.truncate(self.path, self.file_bytes)

    def put(self, topic: str, payload: bytes, qos: int) -> None:
        old = self.messages.get(topic)
        if payload:
            self.messages[topic] = (payload, qos)
            self.live_bytes += _size(topic, payload)
        elif old is None:
            return  # nothing retained to clear
        else:
            del self.messages[topic]
        if old is not None:
            self.live_bytes -= _size(topic, old[0])
        record = _record(topic, payload or None, qos)
        if self.file_bytes > COMPACT_MIN_BYTES and self.file_bytes > 2 * self.live_bytes:
            self._rewrite()
            return
        with open(self.path, "ab") as f:
            f.write(record)
            f.flush()
            if self.sync:
                os.fsync(f.fileno())
        self.file_bytes += len(record)

    def _rewrite(self) -> None:
        data = b"".join(_record(t, p, q) for t, (p, q) in self.messages.items())
        temporary = self.path.with_suffix(".tmp")
        with open(temporary, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        self.file_bytes = len(data)


class RetainedStore:
    """Every vhost's retained messages (a vhost deleted and made again starts empty: its directory went)."""

    def __init__(self) -> None:
        self._by_vhost: weakref.WeakKeyDictionary[VHost, _VHostRetained] = weakref.WeakKeyDictionary()

    def _of(self, vhost: VHost) -> _VHostRetained:
        retained = self._by_vhost.get(vhost)
        if retained is None:
            retained = self._by_vhost[vhost] = _VHostRetained(vhost)
        return retained

    def put(self, vhost: VHost, topic: str, payload: bytes, qos: int) -> None:
        """A retained publish: kept for the topic; an empty payload clears it (the spec's rule)."""
        self._of(vhost).put(topic, payload, qos)

    def matching(self, vhost: VHost, topic_filter: str) -> list[tuple[str, bytes, int]]:
        """(topic, payload, qos) of every retained message the filter matches."""
        return [(topic, payload, qos) for topic, (payload, qos) in self._of(vhost).messages.items()
                if topics.matches(topic_filter, topic)]
