"""QoS 2's in-flight state per client (MQTT 3.1.1, 4.3.3): the packet ids the client published at QoS 2
whose PUBREL has not come yet (a PUBLISH with such an id is a duplicate: answered with PUBREC, not
routed again), and the QoS 2 deliveries to the client awaiting PUBREC (by their queue position, so a
redelivery keeps its packet id) or PUBCOMP (a PUBREL owed, resent when the session resumes).

A persistent session's state (clean session 0) is kept in a file of the vhost's own (``mqtt.qos2``,
through ``VHost.append_file``), a record per change appended as the store's other files are written:
synced by the store's group commit and replicated to a cluster's followers with them, so it survives a
reconnect, a restart and a kill -9. The replies that depend on a record (PUBREC of a new message,
PUBCOMP, PUBREL) go out once it is durable, as a PUBACK waits for its message. A clean session's state
lives in memory, as long as its connection. The file is read whole at the first use after a start (a
torn last record, from a crash mid-write, is dropped) and rewritten with the live state once it holds
mostly stale records."""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..broker.ops import VHost

log = logging.getLogger("lavinpy.mqtt")

FILE_NAME = "mqtt.qos2"
# Records: kind, client id (u16 length, UTF-8), packet id (u16), then the queue position (u64) of SENT,
# the topic filter (u16 length, UTF-8) of GRANTED and UNGRANTED.
RECEIVED = b"I"  # an inbound QoS 2 PUBLISH stored: its id awaits PUBREL
RELEASED = b"i"  # the client's PUBREL for it: the id is free again
SENT = b"S"  # a QoS 2 delivery (queue position, packet id) awaits PUBREC
PUBREL_OWED = b"R"  # its PUBREC came (the message left the queue): PUBREL owed until PUBCOMP
COMPLETE = b"C"  # the client's PUBCOMP
FORGOTTEN = b"F"  # a delivery awaiting PUBREC is no longer in its queue: its id is free
GRANTED = b"Q"  # a topic filter granted QoS 2 (its messages go out at QoS 2 from the QoS 1 queue)
UNGRANTED = b"q"  # the filter unsubscribed, or subscribed again at a lower QoS
DROPPED = b"X"  # the session ended (clean session): all of the client's state goes
_KINDS = frozenset((RECEIVED, RELEASED, SENT, PUBREL_OWED, COMPLETE, FORGOTTEN, GRANTED, UNGRANTED, DROPPED))
_FILTERS = (GRANTED, UNGRANTED)
COMPACT_MIN_BYTES = 1 << 20  # below this the file is never rewritten


class StateFile(Protocol):
    """Where a persistent session's records go (``VHostQoS2``)."""

    def write(self, kind: bytes, client_id: str, packet_id: int, pos: int = 0, topic_filter: str = "") -> bool:
        """Append a record; whether a reply that depends on it waits for ``vhost.durable()``."""

    def write_run(self, kind: bytes, client_id: str, packet_ids: list[int], positions: list[int] | None = None
                  ) -> bool:
        """Append a record per packet id (of SENT: with the position) as one write; as ``write``."""


def _record(kind: bytes, client_id: str, packet_id: int, pos: int = 0, topic_filter: str = "") -> bytes:
    name = client_id.encode("utf-8")
    record = kind + len(name).to_bytes(2, "big") + name + packet_id.to_bytes(2, "big")
    if kind == SENT:
        return record + pos.to_bytes(8, "big")
    if kind in _FILTERS:
        encoded = topic_filter.encode("utf-8")
        return record + len(encoded).to_bytes(2, "big") + encoded
    return record


class ClientState:
    """One client's QoS 2 packet ids in flight, both ways."""

    def __init__(self, client_id: str, file: StateFile | None) -> None:
        self.client_id = client_id
        self.file = file  # None: a clean session's, in memory only
        self.inbound: set[int] = set()  # ids of stored PUBLISHes awaiting PUBREL
        self.sent: dict[int, int] = {}  # queue position -> packet id, awaiting PUBREC
        self.sent_ids: dict[int, int] = {}  # the same, by packet id
        self.pubrel_owed: dict[int, None] = {}  # packet ids awaiting PUBCOMP, in PUBREC order
        self.filters: set[str] = set()  # topic filters granted QoS 2

    def _write(self, kind: bytes, packet_id: int, pos: int = 0, topic_filter: str = "") -> bool:
        file = self.file
        return file is not None and file.write(kind, self.client_id, packet_id, pos, topic_filter)

    def _write_run(self, kind: bytes, packet_ids: list[int], positions: list[int] | None = None) -> bool:
        file = self.file
        return file is not None and bool(packet_ids) and file.write_run(kind, self.client_id, packet_ids, positions)

    @property
    def empty(self) -> bool:
        return not (self.inbound or self.sent or self.pubrel_owed or self.filters)

    def forget_grants(self) -> None:
        """Every filter's QoS 2 grant goes (their queue is gone)."""
        for topic_filter in list(self.filters):
            self.grant(topic_filter, False)

    def grant(self, topic_filter: str, qos2: bool) -> None:
        """A filter subscribed (at QoS 2 or lower) or unsubscribed (``qos2`` False)."""
        if qos2 and topic_filter not in self.filters:
            self.filters.add(topic_filter)
            self._write(GRANTED, 0, topic_filter=topic_filter)
        elif not qos2 and topic_filter in self.filters:
            self.filters.discard(topic_filter)
            self._write(UNGRANTED, 0, topic_filter=topic_filter)

    # --- inbound: PUBLISH -> PUBREC, PUBREL -> PUBCOMP ------------------------------------------------
    def received(self, packet_id: int) -> bool:
        """A QoS 2 PUBLISH was stored: its id is remembered until PUBREL. Whether the PUBREC waits."""
        self.inbound.add(packet_id)
        return self._write(RECEIVED, packet_id)

    def fresh(self, packet_ids: list[int]) -> list[int]:
        """The indexes of the ids in a run of QoS 2 PUBLISHes that are not duplicates (of one stored
        earlier, awaiting PUBREL, or of one earlier in the run): those to store."""
        inbound, seen, indexes = self.inbound, set(), []
        for i, packet_id in enumerate(packet_ids):
            if packet_id not in inbound and packet_id not in seen:
                seen.add(packet_id)
                indexes.append(i)
        return indexes

    def received_run(self, packet_ids: list[int]) -> bool:
        """``received`` for a run of stored PUBLISHes' (distinct, new) ids, recorded as one write."""
        self.inbound.update(packet_ids)
        return self._write_run(RECEIVED, packet_ids)

    def released_run(self, packet_ids: list[int]) -> bool:
        """``released`` for a run of PUBRELs, recorded as one write."""
        inbound, gone, unknown = self.inbound, [], False
        for packet_id in packet_ids:
            if packet_id in inbound:
                inbound.discard(packet_id)
                gone.append(packet_id)
            else:
                unknown = True
        return self._write_run(RELEASED, gone) or (unknown and self.file is not None)

    def released(self, packet_id: int) -> bool:
        """PUBREL: the id is forgotten. Whether the PUBCOMP waits for the disk (a PUBLISH reusing the id
        after PUBCOMP must never be taken for a duplicate); for an id not remembered too, in a
        persistent session: an earlier PUBREL's record may still await its flush."""
        if packet_id not in self.inbound:
            return self.file is not None
        self.inbound.discard(packet_id)
        return self._write(RELEASED, packet_id)

    # --- outbound: PUBLISH -> PUBREC, PUBREL -> PUBCOMP -----------------------------------------------
    def taken(self, packet_id: int) -> bool:
        """Whether an outbound QoS 2 exchange holds the id (beyond the connection's in-flight ones)."""
        return packet_id in self.sent_ids or packet_id in self.pubrel_owed

    def id_of(self, pos: int) -> int | None:
        """The packet id a message at this queue position went out with earlier (a redelivery)."""
        return self.sent.get(pos)

    def sending(self, pos: int, packet_id: int) -> bool:
        """A QoS 2 delivery of the queue's message at ``pos`` goes out with ``packet_id``: whether the
        PUBLISH waits for the record to be durable (else a crash could send it again with another id,
        a second message to the client)."""
        if self.sent.get(pos) == packet_id:
            return False
        old = self.sent.pop(pos, None)
        if old is not None:
            del self.sent_ids[old]
        self.sent[pos] = packet_id
        self.sent_ids[packet_id] = pos
        return self._write(SENT, packet_id, pos)

    def pubrec(self, packet_id: int) -> bool:
        """The client's PUBREC: the PUBREL is owed until PUBCOMP. Whether the PUBREL waits."""
        pos = self.sent_ids.pop(packet_id, None)
        if pos is not None:
            del self.sent[pos]
        if packet_id in self.pubrel_owed:
            return self.file is not None  # a PUBREC again: its record may still await its flush
        self.pubrel_owed[packet_id] = None
        return self._write(PUBREL_OWED, packet_id)

    def pubcomp(self, packet_id: int) -> None:
        if self.pubrel_owed.pop(packet_id, 0) is None:
            self._write(COMPLETE, packet_id)

    def pubcomp_run(self, packet_ids: list[int]) -> None:
        """``pubcomp`` for a run of PUBCOMPs, recorded as one write."""
        pop = self.pubrel_owed.pop
        self._write_run(COMPLETE, [packet_id for packet_id in packet_ids if pop(packet_id, 0) is None])

    def pubrec_run(self, packet_ids: list[int]) -> bool:
        """``pubrec`` for a run of PUBRECs, recorded as one write."""
        sent_ids, sent, owed, fresh, again = self.sent_ids, self.sent, self.pubrel_owed, [], False
        for packet_id in packet_ids:
            pos = sent_ids.pop(packet_id, None)
            if pos is not None:
                del sent[pos]
            if packet_id in owed:
                again = True
            else:
                owed[packet_id] = None
                fresh.append(packet_id)
        return self._write_run(PUBREL_OWED, fresh) or (again and self.file is not None)

    def sending_run(self, positions: list[int], packet_ids: list[int]) -> bool:
        """``sending`` for a run of deliveries, recorded as one write."""
        sent, sent_ids, new_pos, new_ids = self.sent, self.sent_ids, [], []
        for pos, packet_id in zip(positions, packet_ids, strict=True):
            old = sent.get(pos)
            if old == packet_id:
                continue
            if old is not None:
                del sent_ids[old]
            sent[pos] = packet_id
            sent_ids[packet_id] = pos
            new_pos.append(pos)
            new_ids.append(packet_id)
        return self._write_run(SENT, new_ids, new_pos)

    def forget(self, packet_id: int) -> None:
        """The delivery awaiting PUBREC with this id left its queue otherwise (the queue is empty when
        the session resumes: expired, purged, deleted): the id is free."""
        pos = self.sent_ids.pop(packet_id, None)
        if pos is not None:
            del self.sent[pos]
            self._write(FORGOTTEN, packet_id)

    def records(self) -> list[bytes]:
        """The records that rebuild this state."""
        cid = self.client_id
        return ([_record(RECEIVED, cid, i, 0) for i in self.inbound]
                + [_record(SENT, cid, i, pos) for pos, i in self.sent.items()]
                + [_record(PUBREL_OWED, cid, i, 0) for i in self.pubrel_owed]
                + [_record(GRANTED, cid, 0, topic_filter=f) for f in self.filters])


Record = tuple[bytes, str, int, int, str]  # kind, client id, packet id, queue position, topic filter


def _parse(data: bytes) -> tuple[list[Record], int]:
    """The records of a file's bytes and the length of the whole ones."""
    records: list[Record] = []
    pos, end = 0, len(data)
    while pos + 3 <= end:
        kind = data[pos:pos + 1]
        if kind not in _KINDS:
            break
        size = int.from_bytes(data[pos + 1:pos + 3], "big")
        at = pos + 3 + size + 2  # after the packet id
        if at > end:
            break
        client_id = data[pos + 3:pos + 3 + size].decode("utf-8", "replace")
        packet_id = int.from_bytes(data[at - 2:at], "big")
        queue_pos, topic_filter = 0, ""
        if kind == SENT:
            if at + 8 > end:
                break
            queue_pos, at = int.from_bytes(data[at:at + 8], "big"), at + 8
        elif kind in _FILTERS:
            if at + 2 > end:
                break
            length = int.from_bytes(data[at:at + 2], "big")
            if at + 2 + length > end:
                break
            topic_filter, at = data[at + 2:at + 2 + length].decode("utf-8", "replace"), at + 2 + length
        records.append((kind, client_id, packet_id, queue_pos, topic_filter))
        pos = at
    return records, pos


class VHostQoS2:
    """One vhost's persistent sessions' QoS 2 state: in memory, and the file of records."""

    def __init__(self, vhost: VHost) -> None:
        self.file = vhost.append_file(FILE_NAME)
        data = self.file.open()
        records, end = _parse(data)
        if end != len(data):
            log.warning("%s: %d bytes of a torn last record dropped", self.file.path, len(data) - end)
            self.file.truncate(end)
        self.file_bytes = end
        self._check_at = 0  # the file's size past which it may hold mostly stale records
        self.clients: dict[str, ClientState] = {}
        for record in records:
            self._replay(*record)
        for client_id in [c for c, state in self.clients.items() if state.empty]:
            del self.clients[client_id]

    def _replay(self, kind: bytes, client_id: str, packet_id: int, queue_pos: int, topic_filter: str) -> None:
        if kind == DROPPED:
            self.clients.pop(client_id, None)
            return
        state = self.clients.get(client_id)
        if state is None:
            state = self.clients[client_id] = ClientState(client_id, self)
        state.file = None  # replayed, not written again
        if kind == RECEIVED:
            state.received(packet_id)
        elif kind == RELEASED:
            state.released(packet_id)
        elif kind == SENT:
            state.sending(queue_pos, packet_id)
        elif kind == PUBREL_OWED:
            state.pubrec(packet_id)
        elif kind == FORGOTTEN:
            state.forget(packet_id)
        elif kind in _FILTERS:
            state.grant(topic_filter, kind == GRANTED)
        else:
            state.pubcomp(packet_id)
        state.file = self

    def write(self, kind: bytes, client_id: str, packet_id: int, pos: int = 0, topic_filter: str = "") -> bool:
        record = _record(kind, client_id, packet_id, pos, topic_filter)
        self.file_bytes += len(record)
        waits = self.file.append(record)
        if self.file_bytes > max(COMPACT_MIN_BYTES, self._check_at):
            return self._compact() or waits
        return waits

    def _compact(self) -> bool:
        """The file rewritten with the live state if it holds mostly stale records (measured again only
        once the file has grown past twice its size); whether a reply waits for that."""
        live = [r for state in self.clients.values() for r in state.records()]
        live_bytes = sum(map(len, live))
        self._check_at = 2 * live_bytes
        if 2 * live_bytes < self.file_bytes:
            data = b"".join(live)
            self.file_bytes = len(data)
            return self.file.replace(data)
        return False

    def write_run(self, kind: bytes, client_id: str, packet_ids: list[int], positions: list[int] | None = None
                  ) -> bool:
        if len(packet_ids) == 1:
            return self.write(kind, client_id, packet_ids[0], positions[0] if positions else 0)
        name = client_id.encode("utf-8")
        head = kind + len(name).to_bytes(2, "big") + name
        if positions is None:
            data = b"".join([head + packet_id.to_bytes(2, "big") for packet_id in packet_ids])
        else:
            data = b"".join([head + packet_id.to_bytes(2, "big") + pos.to_bytes(8, "big")
                             for packet_id, pos in zip(packet_ids, positions, strict=True)])
        self.file_bytes += len(data)
        waits = self.file.append(data)
        if self.file_bytes > max(COMPACT_MIN_BYTES, self._check_at):
            return self._compact() or waits
        return waits

    def session(self, client_id: str, persistent: bool) -> ClientState:
        """The client's state as its last persistent session left it; a clean session drops it and
        starts one in memory."""
        if persistent:
            state = self.clients.get(client_id)
            if state is None:
                state = self.clients[client_id] = ClientState(client_id, self)
            return state
        if self.clients.pop(client_id, None) is not None:
            self.write(DROPPED, client_id, 0)
        return ClientState(client_id, None)


class QoS2Store:
    """Every vhost's QoS 2 session state (a vhost deleted and made again starts empty)."""

    def __init__(self) -> None:
        self._by_vhost: weakref.WeakKeyDictionary[VHost, VHostQoS2] = weakref.WeakKeyDictionary()

    def of(self, vhost: VHost) -> VHostQoS2:
        found = self._by_vhost.get(vhost)
        if found is None:
            found = self._by_vhost[vhost] = VHostQoS2(vhost)
        return found

    def session(self, vhost: VHost, client_id: str, persistent: bool) -> ClientState:
        return self.of(vhost).session(client_id, persistent)
