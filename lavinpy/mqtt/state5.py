"""The MQTT 5 state of a vhost's persistent sessions (Session Expiry Interval not 0) that outlives the
broker process: each filter's subscription options (QoS, No Local, Retain As Published, subscription
identifier, share name) and the wills waiting for their Will Delay Interval. Kept in memory and in a
file of the vhost's own (``mqtt.v5``, through ``VHost.append_file``), a record per change, synced by
the store's group commit and replicated with its other files, as ``exactly_once`` keeps QoS 2 state.
The file is read whole at the first use after a start (a torn last record is dropped) and rewritten
with the live state once it holds mostly stale records. A delayed will found there is published when
its time comes (at once if that passed while the broker was down), unless its client resumes first."""

from __future__ import annotations

import asyncio
import logging
import struct
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from ..broker.errors import BrokerError
from ..broker.ops.publish import publish
from . import topics

if TYPE_CHECKING:
    from ..broker.ops import ProtocolCounters, VHost

log = logging.getLogger("lavinpy.mqtt")

FILE_NAME = "mqtt.v5"
COMPACT_MIN_BYTES = 1 << 20
# Records: kind, length of the rest (u32), client id (u16 length, UTF-8), then by kind:
OPTIONS = b"O"  # filter (u16 length), QoS, flags (1: no local, 2: retain as published), subscription id
#                 (u32, 0: none), share name (u16 length, empty: none)
UNSUBSCRIBED = b"o"  # filter (u16 length)
DROPPED = b"D"  # the session ended: its options and will go
WILL = b"W"  # due (epoch ms, u64), QoS, retain, topic (u16 length), AMQP properties (u32 length), payload
WILL_GONE = b"w"  # published, or its client resumed the session
_KINDS = frozenset((OPTIONS, UNSUBSCRIBED, DROPPED, WILL, WILL_GONE))


class RetainedPut(Protocol):
    """Where a retained will goes (``retained.RetainedStore``)."""

    def put(self, vhost: VHost, topic: str, payload: bytes, qos: int, properties: bytes | None = None,
            timestamp_ms: int | None = None) -> bool: ...


@dataclass(slots=True)
class FilterOptions:
    """A filter's MQTT 5 subscription options (``group``: a shared subscription's share name)."""

    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    subscription_id: int | None = None
    group: str | None = None


@dataclass(slots=True)
class DelayedWill:
    """A will waiting for its delay, as it is published: to the MQTT exchange with these AMQP properties."""

    due_ms: int
    qos: int
    retain: bool
    topic: str
    properties: bytes
    payload: bytes


def _text(value: str) -> bytes:
    data = value.encode("utf-8")
    return len(data).to_bytes(2, "big") + data


def _record(kind: bytes, client_id: str, rest: bytes = b"") -> bytes:
    body = _text(client_id) + rest
    return kind + len(body).to_bytes(4, "big") + body


def _options_record(client_id: str, topic_filter: str, o: FilterOptions) -> bytes:
    flags = (1 if o.no_local else 0) | (2 if o.retain_as_published else 0)
    return _record(OPTIONS, client_id, _text(topic_filter) + struct.pack(">BBI", o.qos, flags, o.subscription_id or 0)
                   + _text(o.group or ""))


def _will_record(client_id: str, w: DelayedWill) -> bytes:
    return _record(WILL, client_id, struct.pack(">QBB", w.due_ms, w.qos, int(w.retain)) + _text(w.topic)
                   + len(w.properties).to_bytes(4, "big") + w.properties + w.payload)


class _Reader:
    def __init__(self, data: bytes, at: int) -> None:
        self.data, self.at = data, at

    def text(self) -> str:
        size = int.from_bytes(self.data[self.at:self.at + 2], "big")
        self.at += 2 + size
        return self.data[self.at - size:self.at].decode("utf-8", "replace")

    def take(self, size: int) -> bytes:
        self.at += size
        return self.data[self.at - size:self.at]


def parse(data: bytes) -> tuple[list[tuple[bytes, str, object]], int]:
    """The records of a file's bytes (kind, client id, options/will/filter) and the length of the whole ones."""
    records: list[tuple[bytes, str, object]] = []
    pos, end = 0, len(data)
    while pos + 5 <= end:
        kind = data[pos:pos + 1]
        size = int.from_bytes(data[pos + 1:pos + 5], "big")
        if kind not in _KINDS or pos + 5 + size > end:
            break
        reader = _Reader(data[:pos + 5 + size], pos + 5)
        try:
            client_id = reader.text()
            value: object = None
            if kind == OPTIONS:
                topic_filter = reader.text()
                qos, flags, sid = struct.unpack(">BBI", reader.take(6))
                group = reader.text()
                value = (topic_filter, FilterOptions(qos, bool(flags & 1), bool(flags & 2), sid or None, group or None))
            elif kind == UNSUBSCRIBED:
                value = reader.text()
            elif kind == WILL:
                due, qos, retain = struct.unpack(">QBB", reader.take(10))
                topic = reader.text()
                properties = reader.take(int.from_bytes(reader.take(4), "big"))
                value = DelayedWill(due, qos, bool(retain), topic, properties, reader.data[reader.at:])
        except (struct.error, ValueError):
            break
        records.append((kind, client_id, value))
        pos += 5 + size
    return records, pos


@dataclass
class VHostState:
    """The MQTT 5 state of a vhost's sessions: subscription options per client (a persistent
    session's also in the file) and wills waiting for their delay (timer, and how to publish now)."""

    options: dict[str, dict[str, FilterOptions]] = field(default_factory=dict)
    wills: dict[str, tuple[asyncio.TimerHandle, Callable[[], None]]] = field(default_factory=dict)
    persisted: dict[str, DelayedWill] = field(default_factory=dict)  # the delayed wills of the file
    in_file: set[str] = field(default_factory=set)  # clients whose options the file keeps
    file: object | None = None  # the vhost's AppendFile (None: in memory only, a vhost without a store)
    file_bytes: int = 0
    check_at: int = 0
    # client id -> when its session, its connection gone, expires (time.monotonic()): a later CONNECT
    # without Clean Start finds it expired after that, whatever of its state is still kept
    expires_at: dict[str, float] = field(default_factory=dict)
    expires_pruned: int = 0  # entries left by the last pruning of expired ones

    # --- the file ---------------------------------------------------------------------------------
    def _append(self, record: bytes) -> None:
        file = self.file
        if file is None:
            return
        self.file_bytes += len(record)
        file.append(record)  # type: ignore[attr-defined]
        if self.file_bytes > max(COMPACT_MIN_BYTES, self.check_at):
            live = [_options_record(c, f, o) for c, opts in self.options.items() if c in self.in_file
                    for f, o in opts.items()]
            live += [_will_record(c, w) for c, w in self.persisted.items()]
            size = sum(map(len, live))
            self.check_at = 2 * size
            if 2 * size < self.file_bytes:
                self.file_bytes = size
                file.replace(b"".join(live))  # type: ignore[attr-defined]

    # --- subscription options ----------------------------------------------------------------------
    def client_options(self, client_id: str) -> dict[str, FilterOptions]:
        return self.options.setdefault(client_id, {})

    def set_options(self, client_id: str, topic_filter: str, options: FilterOptions, persistent: bool) -> None:
        self.client_options(client_id)[topic_filter] = options
        if persistent:
            self.in_file.add(client_id)
            self._append(_options_record(client_id, topic_filter, options))

    def unsubscribed(self, client_id: str, topic_filter: str, persistent: bool) -> FilterOptions | None:
        found = self.client_options(client_id).pop(topic_filter, None)
        if found is not None and persistent:
            self._append(_record(UNSUBSCRIBED, client_id, _text(topic_filter)))
        return found

    def drop(self, client_id: str) -> None:
        """The session ended (Clean Start, or expiry 0 at its end): its options go."""
        options = self.options.get(client_id)
        if options is not None:
            options.clear()
        if client_id in self.in_file:
            self.in_file.discard(client_id)
            self._append(_record(DROPPED, client_id))

    # --- session expiry ----------------------------------------------------------------------------
    def session_ended(self, client_id: str, expiry: int) -> None:
        """The client's connection is gone and its session lives ``expiry`` more seconds. Expired
        entries are pruned each time the table doubles, so ids that never come back cost no memory."""
        now = time.monotonic()
        self.expires_at[client_id] = now + expiry
        if len(self.expires_at) > max(1024, 2 * self.expires_pruned):
            self.expires_at = {client: at for client, at in self.expires_at.items() if at > now}
            self.expires_pruned = len(self.expires_at)

    def session_expired(self, client_id: str) -> bool:
        """Whether the client's ended session has expired by now (forgotten either way: it resumes)."""
        at = self.expires_at.pop(client_id, None)
        return at is not None and time.monotonic() >= at

    # --- delayed wills -----------------------------------------------------------------------------
    def will_delayed(self, client_id: str, will: DelayedWill) -> None:
        self.persisted[client_id] = will
        self._append(_will_record(client_id, will))

    def will_gone(self, client_id: str) -> None:
        """Published, or its client came back: forgotten (in the file too)."""
        if self.persisted.pop(client_id, None) is not None:
            self._append(_record(WILL_GONE, client_id))


_STATE: weakref.WeakKeyDictionary[VHost, VHostState] = weakref.WeakKeyDictionary()


def vhost_state(vhost: VHost) -> VHostState:
    """The vhost's state, read from its file at the first use after a start."""
    found = _STATE.get(vhost)
    if found is None:
        found = _STATE[vhost] = _load(vhost)
    return found


def _load(vhost: VHost) -> VHostState:
    state = VHostState()
    try:
        file = vhost.append_file(FILE_NAME)
    except (AttributeError, OSError):  # pragma: no cover - a vhost without a store directory
        return state
    data = file.open()
    records, end = parse(data)
    if end != len(data):
        log.warning("%s: %d bytes of a torn last record dropped", file.path, len(data) - end)
        file.truncate(end)
    for kind, client_id, value in records:
        if kind == OPTIONS:
            assert isinstance(value, tuple)
            state.client_options(client_id)[value[0]] = value[1]
            state.in_file.add(client_id)
        elif kind == UNSUBSCRIBED:
            state.client_options(client_id).pop(str(value), None)
        elif kind == DROPPED:
            state.options.pop(client_id, None)
            state.in_file.discard(client_id)
            state.persisted.pop(client_id, None)
        elif kind == WILL:
            assert isinstance(value, DelayedWill)
            state.persisted[client_id] = value
        else:
            state.persisted.pop(client_id, None)
    state.file, state.file_bytes = file, end
    return state


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def schedule_will(state: VHostState, client_id: str, will: DelayedWill, send: Callable[[DelayedWill], None]) -> None:
    """Publish the will when it is due (at once if that has passed), unless the client resumes first
    (the connection then cancels the timer, and publishes at once if its session is a new one)."""
    earlier = state.wills.pop(client_id, None)
    if earlier is not None:
        earlier[0].cancel()

    def publish_now() -> None:
        state.will_gone(client_id)
        send(will)

    def publish_late() -> None:
        if state.wills.get(client_id, (None,))[0] is handle:
            del state.wills[client_id]
            publish_now()

    handle = asyncio.get_running_loop().call_later(max(0, will.due_ms - now_ms()) / 1000, publish_late)
    state.wills[client_id] = (handle, publish_now)


def publish_will(vhost: VHost, exchange_name: str, will: DelayedWill, counters: ProtocolCounters,
                 retained: RetainedPut) -> None:
    """A delayed will to the MQTT exchange (its topic permission was checked when it was delayed)."""
    exchange = vhost.exchanges.get(exchange_name)
    if exchange is None:
        log.info("MQTT will on %r not published: exchange %r is gone", will.topic, exchange_name)
        return
    try:
        if will.retain:
            retained.put(vhost, will.topic, will.payload, will.qos, will.properties, now_ms())
        publish(vhost, exchange, topics.routing_key(will.topic), False, will.properties, will.payload, counters, 0)
    except BrokerError as e:
        log.info("MQTT will on %r not published: %s", will.topic, e)


def stop_wills(vhost: VHost) -> None:
    """The broker stops: the wills' timers go, their records stay."""
    state = _STATE.get(vhost)
    if state is not None:
        for handle, _ in state.wills.values():
            handle.cancel()
        state.wills.clear()


def resume_wills(vhost: VHost, send: Callable[[DelayedWill], None]) -> int:
    """After a start: the delayed wills the vhost's file holds are scheduled again; how many."""
    state = vhost_state(vhost)
    waiting = [(c, w) for c, w in state.persisted.items() if c not in state.wills]
    for client_id, will in waiting:
        schedule_will(state, client_id, will, send)
    return len(waiting)
