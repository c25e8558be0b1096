"""One MQTT connection as a state machine: ``receive_data(bytes)`` in, ``data_to_send()`` and
``take_effects()`` out (the h11 shape; the asyncio adapter in ``transport`` owns the socket and the
timer). Publishes go through the model's publish operations with the exchange's permission and
topic checks; subscriptions are queues and consumers of the model (``subscriptions``)."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from ..broker.errors import BrokerError, ErrorKind
from ..broker.ops import REJECTED, Actor, LoginAttempt, LoginOutcome, PeerCertificate, ProtocolId, Refusal, WindowRates
from ..broker.ops.messages import publish_exchange, publish_topic_check
from ..broker.ops.publish import confirmed, publish, publish_run
from ..broker.ops.replies import ReplyQueue
from ..logs import RateLimitedLog
from ..wire.properties import encode_property_values
from . import codec, topics
from .codec import PUBCOMP_REPLY, PUBREC_REPLY, PUBREL_REPLY, MQTTProtocolError
from .connect_login import connect_login, session_timer
from .effects import Effect, SetTimer
from .subscriptions import PUBLISH_QOS_HEADER, Subscriptions, queue_name
from .topics import MAX_NAME_BYTES

if TYPE_CHECKING:
    import asyncio

    from ..broker.ops import Broker, Exchange, VHost
    from ..config import Config
    from .exactly_once import QoS2Store
    from .retained import RetainedStore

log = logging.getLogger("lavinpy.mqtt")
# Connections closed for the client's doing (bad input, a refused publish, silence): one line each,
# a bounded number per interval, so a flood of bad clients cannot fill the disk.
client_error_log = RateLimitedLog(log)

CONNECT_TIMEOUT = 10.0  # seconds a client has to send CONNECT
# The largest packet before a client has logged in (RabbitMQ's unauthenticated limit): nobody can make
# the server buffer mqtt_max_packet_size without a password.
MAX_PACKET_BEFORE_CONNECT = 65536
# Message properties by the publish's QoS: persistent for QoS 1 and 2, and the QoS for deliveries to MQTT.
QOS_PROPERTIES = {qos: encode_property_values(delivery_mode=2 if qos else 1, headers={PUBLISH_QOS_HEADER: qos})
               for qos in (0, 1, 2)}
# The protocol the model counts a connection's traffic by (RabbitMQ's labels), by protocol level (3.1.1
# until CONNECT says).
PROTOCOLS = {4: ProtocolId("mqtt311", "MQTT 3.1.1"), 3: ProtocolId("mqtt310", "MQTT 3.1"),
             5: ProtocolId("mqtt50", "MQTT 5.0")}
# The model's refusals (broker.errors) as the CONNACK return code of a session it refuses: MQTT 3.1.1
# has one code for a logged-in client that may not have its session (a SUBSCRIBE refused: 0x80; a
# refused PUBLISH or will: the connection closes, 3.1.1 has no negative answer).
CONNACK_CODES: dict[ErrorKind, int] = dict.fromkeys(ErrorKind, codec.NOT_AUTHORIZED)


class MQTTHost(Protocol):
    """What a connection needs of the session registry above it."""

    broker: Broker
    config: Config
    retained: RetainedStore
    qos2: QoS2Store

    def register(self, connection: MQTTConnection) -> None: ...

    def start_task(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` (a login's slow password check) alongside, on the adapter's event loop."""

    def unregister(self, connection: MQTTConnection) -> None: ...


class MQTTConnection:
    def __init__(self, host: MQTTHost, peer: tuple[str, int] | None, local: tuple[str, int] | None = None,
                 tls: bool = False) -> None:
        self.host = host
        self.broker = host.broker
        self.config = host.config
        self.peer = peer
        self.local = local
        self.tls = tls
        self.peer_host = peer[0] if peer else None
        self.peer_certificate: PeerCertificate | None = None  # a verified client certificate (set by the driver)
        self.name = f"{peer[0]}:{peer[1]}" if peer else "unknown"
        self.connected_at = int(time.time() * 1000)  # ms since the epoch, as RabbitMQ lists it
        # RabbitMQ's recv_oct/recv_cnt/send_oct/send_cnt: bytes, socket reads and writes (one write per
        # flush of the output); their rates as AMQP connections give them (``views``).
        self.recv_oct = self.recv_cnt = self.send_oct = self.send_cnt = 0
        self.started = time.monotonic()
        self.byte_rates: WindowRates | None = None  # made on the first look (views): idle devices stay small
        self.counters = self.broker.node_counters.of(PROTOCOLS[4])  # handed to the model (set at CONNECT)
        self.reader = codec.PacketReader(min(self.config.mqtt_max_packet_size, MAX_PACKET_BEFORE_CONNECT))
        self.connected = self.closed = False
        self.writable = True
        self.published = False  # a publisher is no longer read under a resource alarm
        self.reading_paused = False
        self.client_id = ""
        self.username = ""
        self.protocol_level = 4
        self.vhost: VHost | None = None
        self.actor: Actor | None = None
        self.login_outcome: LoginOutcome | None = None  # its login: the backend, when its credential expires
        self.expires_at: float | None = None  # the login's credential (a token's exp): closes the connection
        self.subscriptions: Subscriptions | None = None
        self.keepalive = 0
        self.will: codec.Will | None = None
        self.wakeup: Callable[[], None] = lambda: None  # the adapter flushes output soon
        self._out: list[bytes] = []
        self._effects: list[Any] = []
        self._last_recv = time.monotonic()
        self._exchange: tuple[int, Exchange, Any] | None = None  # (vhost generation, exchange, topic check)
        self._pubacks: list[int] = []  # replies of this input batch: QoS 1 packet ids, QoS 2 ones | *_REPLY
        self._batch_sync = False  # some publish of this batch waits for the disk
        self._replies = ReplyQueue(self)  # PUBACK runs in input order, after the disk
        self._backlog: deque[tuple[int, int, bytes]] = deque()  # packets read, not yet handled
        self._unread = True  # input read before login, not yet split into packets after it
        # A login being decided (the throttle's delay, a slow hash): (CONNECT, vhost, attempt). Meanwhile
        # the connection is not read and the packets after the CONNECT wait in the backlog.
        self._login: tuple[codec.Connect, str, LoginAttempt] | None = None
        self._login_timer = False  # the login waits for the throttle's timer (not for the pool)

    # --- adapter side ------------------------------------------------------------------------------
    def start(self) -> None:
        self._effects.append(SetTimer(CONNECT_TIMEOUT))

    def receive_data(self, data: bytes, write_follows: bool = False) -> None:
        """Input read. ``write_follows``: the caller writes the output at once and then calls
        ``settle_deferred`` (a subscriber's acks then reach its queue after its next deliveries' write)."""
        if self.closed:
            return
        self._last_recv = time.monotonic()
        self.recv_oct += len(data)
        self.recv_cnt += 1
        subs = self.subscriptions
        if subs is not None and data[:1] == b"\x40" and not self._backlog and not self.reader.buffered:
            try:  # a subscriber's read of PUBACKs alone, one run: no packet to handle, no reply batch to end
                if subs.puback_read(data, write_follows):
                    return
            except (MQTTProtocolError, BrokerError) as e:  # as _handle answers them
                self._fail(*((str(e), e.reason) if isinstance(e, MQTTProtocolError) else (e.text, 0x87)))
                return
        self._handle(lambda: self._backlog.extend(self.reader.feed(data, not self.connected)))

    def settle_deferred(self) -> None:
        """What ``receive_data(write_follows=True)`` left for after the write, done."""
        subs = self.subscriptions
        if subs is not None:
            subs.settle_deferred()

    def _handle(self, step: Callable[[], None]) -> None:
        """Run ``step``, then the packets waiting in the backlog; bad input closes the connection.
        Before login the input is read one packet at a time (the CONNECT, under the pre-login size
        limit); what follows it is read once the login has set the limit of a logged-in client."""
        try:
            step()
            backlog, reader = self._backlog, self.reader
            while not self.closed and self._login is None:
                if backlog:
                    self._packet(*backlog.popleft())
                elif reader.buffered and self.connected and self._unread:
                    self._unread = False
                    backlog.extend(reader.feed(b""))
                else:
                    break
        except MQTTProtocolError as e:
            if e.connack is not None and not self.connected:
                self.send(self._connack(False, e.connack, str(e)))
            self._fail(str(e), e.reason)
        except BrokerError as e:  # the model refused (a permission): MQTT 3.1.1 can only close
            self._fail(e.text, 0x87)
        self._end_batch()
        self.update_reading()

    def data_to_send(self) -> list[bytes]:
        subs = self.subscriptions
        if subs is not None and subs.retained_owed and self.writable:
            subs.send_retained_owed()  # the next batch of retained messages owed, while the socket takes them
            if self.reading_paused:
                self.update_reading()  # read again once little is owed
        out, self._out = self._out, []
        if out:
            self.send_cnt += 1
        return out

    def take_effects(self) -> list[Any]:
        effects, self._effects = self._effects, []
        return effects

    def send(self, data: bytes) -> None:
        if not self.closed:
            self._out.append(data)
            self.send_oct += len(data)
            self.wakeup()

    def set_writable(self, writable: bool) -> None:
        self.writable = writable
        if writable and self.subscriptions is not None:
            self.subscriptions.resume()
            if self.subscriptions.retained_owed:
                self.wakeup()  # the next flush sends more of them

    def update_reading(self) -> None:
        """Under a resource alarm a connection that has published is not read (as RabbitMQ blocks
        publishers; the client's TCP window closes), nor one whose login answer is held back; it is
        read again once the alarm clears or the answer went out."""
        subs = self.subscriptions
        owing = subs is not None and subs.retained_owed > self.config.mqtt_max_subscribe_filters
        paused = not self.closed and (self._login is not None or (bool(self.broker.blocked_reason) and self.published)
                                      or owing)
        if paused != self.reading_paused:
            self.reading_paused = paused
            if not paused:
                self._last_recv = time.monotonic()  # what it sent meanwhile was not read: no silence
            self._effects.append(Effect.PAUSE_READING if paused else Effect.RESUME_READING)
            self.wakeup()

    def timer_fired(self) -> None:
        if self.closed:
            return
        if self._login is not None:
            if self._login_timer:
                self._login_timer = False
                self._handle(self._decide_login)
            else:  # the password check is still in the pool: the client is not the one waiting
                self._effects.append(SetTimer(CONNECT_TIMEOUT))
            return
        if not self.connected:
            self._fail("no CONNECT within the connect timeout")
            return
        if self.expires_at is not None and time.time() >= self.expires_at:  # RabbitMQ's: re-auth is a new CONNECT
            self._fail("credential expired", 0x87)  # MQTT 5: not authorized (any more)
        elif self.keepalive:
            limit = self.keepalive * 1.5
            idle = time.monotonic() - self._last_recv
            if self.reading_paused:  # its packets wait unread: not the client's silence
                self._effects.append(SetTimer(session_timer(limit, self.expires_at)))
            elif idle >= limit:
                self._fail(f"no packet for {idle:.1f} s (keepalive {self.keepalive} s)", 0x8D)
            else:
                self._effects.append(SetTimer(session_timer(limit - idle, self.expires_at)))

    def lost(self) -> None:
        """The socket closed (by the client, or after our close): an unclean end publishes the will."""
        self._teardown(publish_will=True)

    def kick(self, reason: str, code: int = 0x98) -> None:
        """Closed by the server: another connection took the client id over, the server stops (``code``:
        the MQTT 5 reason code, administrative action unless said)."""
        log.info("MQTT connection %s (client %r) closed: %s", self.name, self.client_id, reason)
        self._close()
        self._teardown(publish_will=True)

    # --- packets -----------------------------------------------------------------------------------
    def _packet(self, kind: int, flags: int, body: bytes) -> None:
        if not self.connected:
            if kind != codec.CONNECT:
                raise MQTTProtocolError(f"{codec.PACKET_NAMES[kind]} before CONNECT")
            packet = codec.parse_connect(body)
            if len(queue_name(packet.client_id, 1).encode()) > MAX_NAME_BYTES:
                raise MQTTProtocolError("client id too long for its queue names", codec.IDENTIFIER_REJECTED)
            self._on_connect(packet)
            return
        if kind == codec.PUBLISH:
            self._on_publish(flags, body)
        elif kind == codec.PUBACK:
            assert self.subscriptions is not None
            self.subscriptions.puback_run(codec.puback_run(self._backlog, body))
        elif kind == codec.SUBSCRIBE:
            self._on_subscribe(*codec.parse_subscribe(body))
        elif kind == codec.UNSUBSCRIBE:
            packet_id, filters = codec.parse_unsubscribe(body)
            assert self.subscriptions is not None
            for topic_filter in filters:
                self.subscriptions.unsubscribe(topic_filter)
            self.send(codec.unsuback(packet_id))
        elif kind == codec.PINGREQ:
            if body:
                raise MQTTProtocolError("PINGREQ with a body")
            self.send(codec.PINGRESP_PACKET)
        elif kind == codec.DISCONNECT:
            if body:
                raise MQTTProtocolError("DISCONNECT with a body")
            self.will = None  # a clean end: the will is dropped
            self._close()
        elif kind in (codec.PUBREC, codec.PUBREL, codec.PUBCOMP):
            self._on_qos2(kind, codec.puback_run(self._backlog, body, kind))
        elif kind == codec.CONNECT:
            raise MQTTProtocolError("a second CONNECT")
        else:  # CONNACK, SUBACK, PINGRESP... are the server's packets
            raise MQTTProtocolError(f"unexpected {codec.PACKET_NAMES[kind]}")

    def _on_connect(self, packet: codec.Connect) -> None:
        self.protocol_level = packet.level
        if not packet.client_id and not packet.clean_session:
            raise MQTTProtocolError("empty client id with clean_session=0", codec.IDENTIFIER_REJECTED)
        if packet.level == 3 and len(packet.client_id) > 23:
            raise MQTTProtocolError("MQTT 3.1 client id over 23 characters", codec.IDENTIFIER_REJECTED)
        if packet.will is not None:
            try:
                topics.check_topic_name(packet.will.topic)
            except topics.TopicError as e:
                raise MQTTProtocolError(f"will: {e}") from None
        # The model's one login operation: the throttle's delay, the password (a slow hash in its
        # worker pool), the loopback-only rule, then the vhost, the limits and the user's access.
        asked = connect_login(self.config, packet, self.peer_certificate, self.peer_host)
        if asked is None:
            client_error_log.log(logging.INFO, "MQTT connection %s: anonymous login refused", self.name)
            self.send(self._connack(False, codec.NOT_AUTHORIZED, "anonymous login refused"))
            self._close()
            return
        request, vhost_name = asked
        login = self.broker.logins.attempt(request)
        self._login = (packet, vhost_name, login)
        if login.delay:  # answered later, right or wrong, without holding anyone else up
            self._login_timer = True
            self._effects.append(SetTimer(login.delay))
        else:
            self._decide_login()

    def _decide_login(self) -> None:
        assert self._login is not None
        packet, vhost_name, login = self._login
        outcome = login.decide_now()
        if outcome is None:
            self.host.start_task(self._await_login(login))
            return
        self._login = None
        self._finish_connect(packet, vhost_name, outcome)

    async def _await_login(self, login: LoginAttempt) -> None:
        outcome = await login.decide()
        pending = self._login
        if pending is None or pending[2] is not login or self.closed:
            return  # the client went away meanwhile
        self._login = None
        self._handle(lambda: self._finish_connect(pending[0], pending[1], outcome))

    def _finish_connect(self, packet: codec.Connect, vhost_name: str, outcome: LoginOutcome) -> None:
        if outcome.ok:  # the vhost (maybe deleted while the answer was held back), the limits, the access
            outcome = self.broker.logins.admit(outcome, vhost_name)
        if not outcome.ok:
            if outcome.refusal is Refusal.CREDENTIALS:
                code = codec.BAD_USERNAME_OR_PASSWORD
            else:
                code = codec.NOT_AUTHORIZED
                client_error_log.log(logging.INFO, "MQTT connection %s: %s", self.name, outcome.text)
            self.send(self._connack(False, code, outcome.text))
            self._close()
            return
        vhost, actor = outcome.vhost, outcome.actor
        assert vhost is not None and actor is not None
        username = self.username = outcome.username
        self.vhost, self.actor, self.login_outcome, self.expires_at = vhost, actor, outcome, outcome.expires_at
        self.client_id = packet.client_id or f"lavinpy-{id(self):x}"
        actor.client_id = self.client_id  # {client_id} in topic permissions
        self.counters = self.broker.node_counters.of(PROTOCOLS.get(packet.level, PROTOCOLS[4]))
        subscriptions = self._new_subscriptions(actor, vhost, packet)
        try:  # authorised for the session before it takes the client id over from another connection
            self._check_session(actor, vhost, packet.clean_session)
        except BrokerError as e:
            client_error_log.log(logging.INFO, "MQTT connection %s: session of client %r refused: %s", self.name,
                                 self.client_id, e.text)
            self.broker.client_limits.connection_closed(vhost.name, username)  # admitted: uncounted
            self.send(self._connack(False, CONNACK_CODES[e.kind], e.text))
            self._close()
            return
        self.keepalive = packet.keepalive
        self.will = packet.will
        self.connected = True
        self.reader.max_packet_size = self.config.mqtt_max_packet_size
        self.host.register(self)  # takes the client id over from an earlier connection
        self.subscriptions = subscriptions
        try:
            present = subscriptions.start()
        except BrokerError as e:  # may not delete or consume from what an earlier session left
            client_error_log.log(logging.INFO, "MQTT connection %s: session of client %r refused: %s", self.name,
                                 self.client_id, e.text)
            self.will = None  # never accepted: no will
            self.send(self._connack(False, CONNACK_CODES[e.kind], e.text))
            self._close()
            return
        self.send(self._connack(present, codec.ACCEPTED))
        subscriptions.resend_pubrels()
        self._effects.append(SetTimer(session_timer(self.keepalive * 1.5, self.expires_at)))
        log.info("MQTT connection %s opened (client %r, user %r, vhost %r)", self.name, self.client_id,
                 username, vhost.name)

    def _connack(self, present: bool, code: int, text: str = "") -> bytes:
        return codec.connack(present, code)

    def _new_subscriptions(self, actor: Actor, vhost: VHost, packet: codec.Connect) -> Subscriptions:
        return Subscriptions(self, actor, vhost, self.config.mqtt_exchange, self.client_id, packet.clean_session,
                             self.config.mqtt_inflight_window, self.host.qos2)

    def _check_session(self, actor: Actor, vhost: VHost, clean_session: bool) -> None:
        """The rights ``Subscriptions.start`` will use on what an earlier session left: configure to
        delete its queues (a clean session), read to consume from them (a persistent one)."""
        kind = "configure" if clean_session else "read"
        for qos in (0, 1):
            name = queue_name(self.client_id, qos)
            if name in vhost.queues:
                actor.check(kind, "queue", name, vhost.name)

    def _on_publish(self, flags: int, body: bytes) -> None:
        """A PUBLISH and the run of PUBLISH packets after it in this read with the same topic and
        QoS (no retain): routed, stored and counted once through the model's run operation."""
        packet = codec.parse_publish(flags, body)
        try:
            topics.check_topic_name(packet.topic)
        except topics.TopicError as e:
            raise MQTTProtocolError(str(e)) from None
        qos = packet.qos
        self.published = True
        vhost, backlog = self.vhost, self._backlog
        assert vhost is not None
        max_size = vhost.config.max_message_size
        if packet.retain or not backlog or backlog[0][0] != codec.PUBLISH or len(packet.payload) > max_size:
            payloads, packet_ids = [packet.payload], [packet.packet_id]
        else:
            payloads, packet_ids = codec.publish_run_tail(backlog, flags, body, packet.payload, packet.packet_id,
                                                          max_size)
        if qos == 2:
            return self._publish_exactly_once(packet, payloads, packet_ids)
        if len(payloads) == 1:
            return self._publish_one(packet.topic, packet.payload, qos, packet.retain, packet.packet_id)
        exchange, key = self._target(packet.topic)
        needs_sync = publish_run(vhost, exchange, key, QOS_PROPERTIES[qos], payloads, self.counters, qos > 0)
        if needs_sync is None:  # not a run the model takes whole: one by one
            for payload, packet_id in zip(payloads, packet_ids, strict=True):
                self._publish_one(packet.topic, payload, qos, False, packet_id)
            return
        if qos:
            self._pubacks.extend(packet_ids)
            self._batch_sync = self._batch_sync or needs_sync

    def _publish_one(self, topic: str, payload: bytes, qos: int, retain: bool, packet_id: int) -> None:
        needs_sync = self._publish(topic, payload, qos, retain)
        if qos and needs_sync is not None:  # None: a queue refused it, no PUBACK (the client sends it again)
            self._pubacks.append(packet_id)
            self._batch_sync = self._batch_sync or needs_sync

    def _publish_exactly_once(self, packet: codec.Publish, payloads: list[bytes], packet_ids: list[int]) -> None:
        """QoS 2 (a run as one): stored once per id until PUBREL; PUBRECs after the disk, a duplicate's too."""
        assert self.subscriptions is not None and self.vhost is not None
        state, pubacks, fresh = self.subscriptions.qos2, self._pubacks, self.subscriptions.qos2.fresh(packet_ids)
        if len(fresh) > 1:
            exchange, key = self._target(packet.topic)
            sync = publish_run(self.vhost, exchange, key, QOS_PROPERTIES[2], [payloads[i] for i in fresh],
                               self.counters, True)
            if sync is not None:
                sync = state.received_run([packet_ids[i] for i in fresh]) or sync
                self._batch_sync = self._batch_sync or sync or len(fresh) < len(packet_ids)
                return pubacks.extend([packet_id | PUBREC_REPLY for packet_id in packet_ids])
        for payload, packet_id in zip(payloads, packet_ids, strict=True):  # one by one
            duplicate = packet_id in state.inbound
            one = True if duplicate else self._publish(packet.topic, payload, 2, packet.retain)
            if one is None:
                continue  # a queue refused it: no PUBREC, the client sends it again
            one = duplicate or state.received(packet_id) or one
            self._batch_sync = self._batch_sync or one
            pubacks.append(packet_id | PUBREC_REPLY)

    def _on_qos2(self, kind: int, packet_ids: list[int]) -> None:
        """A read's run of PUBRELs (PUBCOMP to unknown ids too: 3.1.1, 4.3.3), PUBRECs or PUBCOMPs as one."""
        subs = self.subscriptions
        assert subs is not None
        if kind == codec.PUBCOMP:
            return subs.pubcomp_run(packet_ids)
        released = kind == codec.PUBREL
        waits = subs.qos2.released_run(packet_ids) if released else subs.pubrec_run(packet_ids)
        self._pubacks.extend([packet_id | (PUBCOMP_REPLY if released else PUBREL_REPLY) for packet_id in packet_ids])
        self._batch_sync = self._batch_sync or waits

    def _target(self, topic: str) -> tuple[Exchange, str]:
        """The MQTT exchange (cached per vhost generation) and the topic's routing key, checked
        against the user's topic permissions."""
        vhost, actor = self.vhost, self.actor
        assert vhost is not None
        cached = self._exchange
        if cached is None or cached[0] != vhost.generation:
            exchange = publish_exchange(actor, vhost, self.config.mqtt_exchange)
            cached = self._exchange = (vhost.generation, exchange, publish_topic_check(actor, vhost, exchange))
        _, exchange, check = cached
        key = topics.routing_key(topic)
        if check is not None:
            check(key)
        return exchange, key

    def _publish(self, topic: str, payload: bytes, qos: int, retain: bool, properties: bytes | None = None
                 ) -> bool | None:
        """Publish to the MQTT exchange as the model books it (``properties``: the AMQP ones, else
        those of the QoS); whether its PUBACK waits for the disk (None: a queue rejected it)."""
        vhost = self.vhost
        assert vhost is not None
        exchange, key = self._target(topic)
        max_size = vhost.config.max_message_size
        if len(payload) > max_size:
            raise MQTTProtocolError(f"message size {len(payload)} is larger than max size {max_size}")
        retained_waits = retain and self.host.retained.put(vhost, topic, payload, qos, properties)
        _, confirm = publish(vhost, exchange, key, False, properties or QOS_PROPERTIES[qos], payload, self.counters,
                             int(qos > 0))
        if confirm is REJECTED:
            return None
        return bool(confirm) or retained_waits

    def _on_subscribe(self, packet_id: int, requested: list[tuple[str, int]]) -> None:
        """At most ``mqtt_max_subscribe_filters`` filters; a filter repeated in the packet is one
        subscription (the last request replaces the earlier, as a repeated SUBSCRIBE does; the SUBACK
        has a code per request all the same) whose retained messages are owed once. They go out
        after the SUBACK as the socket takes them; while more than a packet's worth of filters is
        owed, the client is not read."""
        subs, vhost = self.subscriptions, self.vhost
        assert subs is not None and vhost is not None
        limit = self.config.mqtt_max_subscribe_filters
        if len(requested) > limit:
            raise MQTTProtocolError(f"SUBSCRIBE with {len(requested)} topic filters, over mqtt_max_subscribe_filters "
                                    f"{limit}")
        granted = {topic_filter: subs.subscribe(topic_filter, qos) for topic_filter, qos in dict(requested).items()}
        self.send(codec.suback(packet_id, [granted[topic_filter] for topic_filter, _ in requested]))
        source = self.host.retained.of(vhost)
        for topic_filter, qos in granted.items():
            if qos != codec.SUBACK_FAILURE:
                subs.queue_retained(source, topic_filter, qos)

    # --- PUBACKs in input order, each after its message is durable when the fsync policy asks ---------
    def _end_batch(self) -> None:
        """One reply queue entry per input batch: its PUBACKs, after the flush some of them wait for. A
        failed flush or replication closes the connection (broker.ops.replies), so the client publishes
        them again."""
        ids, self._pubacks = self._pubacks, []
        sync, self._batch_sync = self._batch_sync, False
        if not ids or self.closed:
            return
        assert self.vhost is not None
        self._replies.commit(self.vhost.durable(acks=False) if sync else None, ids)

    def send_after(self, wait: asyncio.Future[None] | None, data: bytes) -> None:
        """Output (a QoS 2 PUBLISH) after ``wait`` and the replies before it (subscriptions.SubscriberHost)."""
        self._replies.commit(wait, data)

    # the reply queue's sink (broker.ops.replies.ReplySink)
    def send_reply(self, reply: list[int] | bytes) -> None:
        if isinstance(reply, bytes):
            return self.send(reply)
        self._send_pubacks(reply)

    def durability_failed(self, reply: list[int] | bytes, reason: str) -> None:
        log.error("MQTT connection %s (client %r) closed: replies withheld: %s", self.name, self.client_id, reason)
        self._close()

    def _send_pubacks(self, packet_ids: list[int]) -> None:
        """PUBACKs (and QoS 2's replies) as one write; PUBACKs and PUBRECs counted as confirms (the
        model's and this protocol's)."""
        if self.closed:
            return
        data, count = codec.replies(packet_ids)
        self.send(data)
        assert self.vhost is not None
        confirmed(self.vhost, count, self.counters)

    # --- ending -----------------------------------------------------------------------------------
    def _fail(self, reason: str, code: int = 0x80) -> None:
        """Close for the client's doing (``code``: the MQTT 5 reason code)."""
        if self.closed:
            return
        client_error_log.log(logging.INFO, "MQTT connection %s (client %r) closed: %s", self.name,
                             self.client_id or "-", reason)
        self._close()

    def _close(self) -> None:
        self._replies.stop()
        if not self.closed:
            self._effects.append(Effect.CLOSE)
            self.wakeup()
            self.closed = True

    def _teardown(self, publish_will: bool) -> None:
        self.closed = True
        self.reader.release()  # an unfinished packet's bytes (this object may outlive us in a cycle)
        login, self._login = self._login, None
        if login is not None:
            login[2].abandon()
        self._replies.stop()
        subs, self.subscriptions = self.subscriptions, None
        if subs is None:
            return
        assert self.vhost is not None
        self.broker.client_limits.connection_closed(self.vhost.name, self.username)  # admitted: uncounted
        self.host.unregister(self)
        will, self.will = self.will, None
        if publish_will and will is not None:
            self._publish_will(will)
        subs.close()

    def _publish_will(self, will: codec.Will, properties: bytes | None = None) -> None:
        try:
            self._publish(will.topic, will.payload, will.qos, will.retain, properties)
        except (BrokerError, MQTTProtocolError, topics.TopicError) as e:
            log.info("MQTT client %r: its will was not published: %s", self.client_id, getattr(e, "text", e))
