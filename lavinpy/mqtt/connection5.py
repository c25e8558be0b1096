"""A connection that speaks MQTT 3.1.1 (and 3.1) as ``connection.MQTTConnection`` does, and MQTT 5 once
its CONNECT says protocol level 5: properties on CONNECT and CONNACK, a reason code on every ack,
DISCONNECT both ways with its reason, topic aliases, message properties carried to and from AMQP
(``message5``), session and message expiry, receive maximum, maximum packet size, will delay,
subscription options, subscription identifiers and shared subscriptions (``subscriptions5``). The
model, the login and the QoS 2 handshake are the 3.1.1 connection's."""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..broker.errors import BrokerError
from ..broker.ops.publish import publish_run
from . import codec, codec5, topics
from .auth5 import connect_method, reauthentication
from .auth5 import success as auth_success
from .codec import PUBCOMP_REPLY, PUBREC_REPLY, PUBREL_REPLY, MQTTProtocolError
from .connect_login import session_timer
from .connection import QOS_PROPERTIES, MQTTConnection, client_error_log
from .effects import SetTimer
from .message5 import amqp_properties
from .properties import (
    BAD_USER_NAME_OR_PASSWORD,
    CLIENT_IDENTIFIER_NOT_VALID,
    NOT_AUTHORIZED,
    PACKET_IDENTIFIER_NOT_FOUND,
    PAYLOAD_FORMAT_INVALID,
    RECEIVE_MAXIMUM_EXCEEDED,
    SERVER_UNAVAILABLE,
    TOPIC_ALIAS_INVALID,
    TOPIC_NAME_INVALID,
    UNSUPPORTED_PROTOCOL_VERSION,
    protocol_error,
)
from .state5 import DelayedWill, now_ms, publish_will, schedule_will, vhost_state
from .subscriptions import Subscriptions, queue_name
from .subscriptions5 import ClientLimits, Subscriptions5, retained_for
from .topics import MAX_NAME_BYTES

if TYPE_CHECKING:
    from ..broker.ops import Actor, LoginAttempt, LoginOutcome, VHost

log = logging.getLogger("lavinpy.mqtt")

# MQTT 3.1.1 CONNACK return codes as MQTT 5 reason codes.
CONNACK_REASONS = {codec.UNACCEPTABLE_PROTOCOL_VERSION: UNSUPPORTED_PROTOCOL_VERSION,
                   codec.IDENTIFIER_REJECTED: CLIENT_IDENTIFIER_NOT_VALID, codec.SERVER_UNAVAILABLE: SERVER_UNAVAILABLE,
                   codec.BAD_USERNAME_OR_PASSWORD: BAD_USER_NAME_OR_PASSWORD, codec.NOT_AUTHORIZED: NOT_AUTHORIZED}


@dataclass(slots=True)
class Session5:
    """What an MQTT 5 CONNECT asked for, and the connection's MQTT 5 state."""

    properties: dict[str, Any]
    will_properties: dict[str, Any] = field(default_factory=dict)
    session_expiry: int = 0
    assigned_id: str | None = None
    aliases_in: dict[int, str] = field(default_factory=dict)  # topic aliases the client set
    no_local: bool = False  # some filter of the session asks No Local: its publishes are marked
    answered: bool = False  # the CONNACK went out
    server_keepalive: int | None = None  # the keepalive the server set instead of the client's
    problem_information: bool = True  # reason strings may be sent
    auth_method: str | None = None  # the enhanced authentication method agreed at CONNECT
    reauth: LoginAttempt | None = None  # a re-authentication (AUTH 0x19) being decided
    # The client's QoS 1 publishes without their PUBACK sent, and QoS 2 ones released (PUBREL) without
    # their PUBCOMP sent; with the QoS 2 ids awaiting PUBREL, what Receive Maximum bounds (4.9).
    acks_owed: int = 0


class MQTT5Connection(MQTTConnection):
    v5: Session5 | None = None

    def _packet(self, kind: int, flags: int, body: bytes) -> None:
        v5 = self.v5
        if v5 is None:
            if kind == codec.CONNECT and not self.connected and codec5.is_v5_connect(body):
                return self._connect5(body)
            return super()._packet(kind, flags, body)
        subs = self.subscriptions
        assert subs is not None
        if kind == codec.PUBLISH:
            self._publish5(flags, body)
        elif kind == codec.PUBACK:  # a run of short (success) PUBACKs settles as one, as in 3.1.1
            subs.puback_run(codec.puback_run(self._backlog, body) if len(body) == 2
                            else [codec5.parse_ack(body, "PUBACK")[0]])
        elif kind in (codec.PUBREC, codec.PUBREL, codec.PUBCOMP):
            packet_id, reason, _ = codec5.parse_ack(body, codec.PACKET_NAMES[kind])
            if kind == codec.PUBREC and reason >= 0x80:  # refused: the exchange ends here, no PUBREL
                subs.pubrec(packet_id)
                subs.pubcomp(packet_id)
            elif kind == codec.PUBREL and packet_id not in subs.qos2.inbound:  # PUBCOMP says so (3.7.2.1)
                self._end_batch()
                self.send_after(None, codec5.ack(codec.PUBCOMP, packet_id, PACKET_IDENTIFIER_NOT_FOUND))
            else:
                self._on_qos2(kind, [packet_id])
        elif kind == codec.SUBSCRIBE:
            self._subscribe5(*codec5.parse_subscribe(body))
        elif kind == codec.UNSUBSCRIBE:
            packet_id, filters = codec5.parse_unsubscribe(body)
            assert isinstance(subs, Subscriptions5)
            self.send(codec5.unsuback(packet_id, [subs.unsubscribe5(f) for f in filters]))
        elif kind == codec.DISCONNECT:
            self._disconnect5(*codec5.parse_disconnect(body))
        elif kind == codec.AUTH:
            self._auth5(body)
        elif kind == codec.PINGREQ:
            super()._packet(kind, flags, body)
        else:
            raise protocol_error(f"unexpected {codec.PACKET_NAMES[kind]}")

    # --- CONNECT / CONNACK -------------------------------------------------------------------------
    def _connect5(self, body: bytes) -> None:
        self.v5 = v5 = Session5({})
        parsed = codec5.parse_connect(body)
        packet, props = parsed.connect, parsed.properties
        v5.properties, v5.will_properties = props, parsed.will_properties
        v5.problem_information = props.get("request_problem_information", 1) == 1
        self.reader.auth = True
        try:  # enhanced authentication: a token as the authentication data (``auth5``)
            v5.auth_method = connect_method(props, packet)
        except MQTTProtocolError as e:
            self.protocol_level = codec5.LEVEL
            self.send(self._connack(False, e.connack or e.reason, str(e)))
            self._close()
            return
        v5.session_expiry = min(props.get("session_expiry_interval", 0), self.config.mqtt_max_session_expiry_interval)
        if not packet.client_id:
            packet.client_id = v5.assigned_id = f"lavinpy-{uuid.uuid4().hex}"
        if len(queue_name(packet.client_id, 1).encode()) > MAX_NAME_BYTES:
            raise MQTTProtocolError("client id too long for its queue names", codec.IDENTIFIER_REJECTED)
        maximum = self.config.mqtt_max_keepalive
        if maximum and (packet.keepalive == 0 or packet.keepalive > maximum):
            packet.keepalive = v5.server_keepalive = maximum  # told in the CONNACK's Server Keep Alive
        self._on_connect(packet)

    def _connack(self, present: bool, code: int, text: str = "") -> bytes:
        v5 = self.v5
        if v5 is None:
            return super()._connack(present, code, text)
        v5.answered = True
        reason = CONNACK_REASONS.get(code, code)
        if reason:
            return codec5.connack(False, reason, self._reason_string(text))
        assert self.vhost is not None
        state = vhost_state(self.vhost)
        pending = state.wills.pop(self.client_id, None)
        if pending is not None:  # back within the will delay: the session goes on without its will,
            pending[0].cancel()
            if self.subscriptions is not None and self.subscriptions.clean_session:  # unless it is a new one
                pending[1]()
        state.will_gone(self.client_id)
        asked = v5.properties
        props: dict[str, Any] = {"maximum_packet_size": self.config.mqtt_max_packet_size,
                                 "topic_alias_maximum": self.config.mqtt_topic_alias_maximum or None,
                                 "assigned_client_identifier": v5.assigned_id,
                                 "authentication_method": v5.auth_method}
        if asked.get("session_expiry_interval", 0) != v5.session_expiry:
            props["session_expiry_interval"] = v5.session_expiry
        if v5.server_keepalive is not None:
            props["server_keep_alive"] = v5.server_keepalive
        if self.config.mqtt_receive_maximum < 65535:  # absent: 65535 (3.2.2.3.3)
            props["receive_maximum"] = self.config.mqtt_receive_maximum
        return codec5.connack(present, 0, props)

    def _reason_string(self, text: str) -> dict[str, Any] | None:
        v5 = self.v5
        if not text or v5 is None or not v5.problem_information:
            return None
        text = text[:200]
        if len(text.encode()) + 16 > v5.properties.get("maximum_packet_size", 1 << 28):
            return None  # a reason string is left out rather than send a packet the client refuses (3.1.2.25)
        return {"reason_string": text}

    def _new_subscriptions(self, actor: Actor, vhost: VHost, packet: codec.Connect) -> Subscriptions:
        v5 = self.v5
        if v5 is None:
            return super()._new_subscriptions(actor, vhost, packet)
        props = v5.properties
        limits = ClientLimits(packet.clean_session, v5.session_expiry, props.get("maximum_packet_size"),
                              props.get("topic_alias_maximum", 0))
        window = min(self.config.mqtt_inflight_window, props.get("receive_maximum", 65535))
        subscriptions = Subscriptions5(self, actor, vhost, self.config.mqtt_exchange, self.client_id, limits, window,
                                       self.host.qos2)
        v5.no_local = any(o.no_local for o in subscriptions.options.values())
        return subscriptions

    # --- PUBLISH ----------------------------------------------------------------------------------
    def _publish5(self, flags: int, body: bytes) -> None:
        packet, props = codec5.parse_publish(flags, body)
        v5 = self.v5
        assert v5 is not None
        topic = packet.topic
        alias = props.get("topic_alias")
        if alias is not None:
            if alias > self.config.mqtt_topic_alias_maximum:
                raise MQTTProtocolError(f"topic alias {alias} over the maximum "
                                        f"{self.config.mqtt_topic_alias_maximum}", reason=TOPIC_ALIAS_INVALID)
            if topic:
                v5.aliases_in[alias] = topic
            elif alias in v5.aliases_in:
                topic = v5.aliases_in[alias]
            else:
                raise protocol_error(f"topic alias {alias} was never set")
        if "subscription_identifier" in props:
            raise protocol_error("PUBLISH from a client with a subscription identifier")
        try:
            topics.check_topic_name(topic)
        except topics.TopicError as e:
            raise MQTTProtocolError(str(e), reason=TOPIC_NAME_INVALID) from None
        qos, packet_id = packet.qos, packet.packet_id
        self.published = True
        subs = self.subscriptions
        assert subs is not None
        if qos == 1 or (qos == 2 and packet_id not in subs.qos2.inbound):  # not a duplicate awaiting PUBREL
            self._admit(qos, 1)
        if props.get("payload_format_indicator") == 1:
            try:
                packet.payload.decode("utf-8")
            except UnicodeDecodeError:
                if not qos:
                    raise MQTTProtocolError("payload is not UTF-8 as its format indicator says",
                                            reason=PAYLOAD_FORMAT_INVALID) from None
                return self._refuse(qos, packet_id, PAYLOAD_FORMAT_INVALID, "payload is not UTF-8")
        vhost, backlog = self.vhost, self._backlog
        assert vhost is not None
        if (not props and qos < 2 and not packet.retain and not v5.no_local and backlog
                and backlog[0][0] == codec.PUBLISH and len(packet.payload) <= vhost.config.max_message_size):
            payloads, packet_ids = codec5.publish_run_tail(backlog, flags, body, packet.payload, packet_id,
                                                           vhost.config.max_message_size)
            self._admit(qos, len(packet_ids) - 1)  # the first was admitted above
            if len(payloads) == 1 or not self._publish_run(topic, qos, payloads, packet_ids):
                for payload, each_id in zip(payloads, packet_ids, strict=True):
                    self._publish_plain(topic, payload, qos, each_id)
            return
        if props or packet.retain or v5.no_local:
            properties: bytes | None = amqp_properties(qos, props, retain=packet.retain,
                                                       publisher=self.client_id if v5.no_local else None)
        else:
            properties = None  # as a 3.1.1 publish of that QoS
        try:
            if qos == 2:
                assert self.subscriptions is not None
                state = self.subscriptions.qos2
                sync: bool | None = True
                if packet_id not in state.inbound:
                    sync = self._publish(topic, packet.payload, 2, packet.retain, properties)
                    if sync is None:
                        return
                    sync = state.received(packet_id) or sync
                self._batch_sync = self._batch_sync or bool(sync)
                self._pubacks.append(packet_id | PUBREC_REPLY)
                return
            sync = self._publish(topic, packet.payload, qos, packet.retain, properties)
        except BrokerError as e:  # refused by a permission: the ack says so (QoS 0: the connection ends)
            if not qos:
                raise
            return self._refuse(qos, packet_id, NOT_AUTHORIZED, e.text)
        if qos and sync is not None:
            self._pubacks.append(packet_id)
            self._batch_sync = self._batch_sync or sync

    def _publish_run(self, topic: str, qos: int, payloads: list[bytes], packet_ids: list[int]) -> bool:
        """A run of PUBLISH packets without properties, routed, stored and counted once by the model's run
        operation (False: not a run it takes whole)."""
        assert self.vhost is not None
        exchange, key = self._target(topic)
        needs_sync = publish_run(self.vhost, exchange, key, QOS_PROPERTIES[qos], payloads, self.counters, qos > 0)
        if needs_sync is None:
            return False
        if qos:
            self._pubacks.extend(packet_ids)
            self._batch_sync = self._batch_sync or needs_sync
        return True

    def _publish_plain(self, topic: str, payload: bytes, qos: int, packet_id: int) -> None:
        try:
            sync = self._publish(topic, payload, qos, False)
        except BrokerError as e:
            if not qos:
                raise
            return self._refuse(qos, packet_id, NOT_AUTHORIZED, e.text)
        if qos and sync is not None:
            self._pubacks.append(packet_id)
            self._batch_sync = self._batch_sync or sync

    def _refuse(self, qos: int, packet_id: int, reason: int, text: str) -> None:
        """A PUBACK or PUBREC with an error reason, in order after the replies before it."""
        if qos == 1 and self.v5 is not None:  # answered: out of the Receive Maximum's count
            self.v5.acks_owed -= 1
        self._end_batch()
        kind = codec.PUBACK if qos == 1 else codec.PUBREC
        self.send_after(None, codec5.ack(kind, packet_id, reason, self._reason_string(text)))

    # --- flow control of the client's publishes (4.9) -------------------------------------------------
    def _admit(self, qos: int, count: int) -> None:
        """``count`` new QoS ``qos`` PUBLISH packets: with them, more unanswered than Receive Maximum
        (``mqtt_receive_maximum``) is a DISCONNECT with 0x93, before any of them is routed. A QoS 1 one
        counts from here (``_refuse`` answers it too); a QoS 2 one while its id awaits PUBREL."""
        v5, subs = self.v5, self.subscriptions
        if not qos or not count or v5 is None or subs is None:
            return
        limit = self.config.mqtt_receive_maximum
        unanswered = v5.acks_owed + len(subs.qos2.inbound) + count
        if unanswered > limit:
            raise MQTTProtocolError(f"{unanswered} QoS 1 and 2 publishes unacknowledged, over the Receive "
                                    f"Maximum {limit}", reason=RECEIVE_MAXIMUM_EXCEEDED)
        if qos == 1:
            v5.acks_owed += count

    def _on_qos2(self, kind: int, packet_ids: list[int]) -> None:
        super()._on_qos2(kind, packet_ids)
        if kind == codec.PUBREL and self.v5 is not None:  # released: counted until their PUBCOMP goes
            self.v5.acks_owed += len(packet_ids)

    def _send_pubacks(self, packet_ids: list[int]) -> None:
        v5 = self.v5
        if v5 is not None and v5.acks_owed:  # PUBACKs (the id alone) and PUBCOMPs answer a publish
            v5.acks_owed -= sum(1 for reply in packet_ids
                                if reply < PUBREC_REPLY or PUBCOMP_REPLY <= reply < PUBREL_REPLY)
        super()._send_pubacks(packet_ids)

    # --- SUBSCRIBE ---------------------------------------------------------------------------------
    def _subscribe5(self, packet_id: int, requests: list[codec5.SubscriptionRequest]) -> None:
        subs, vhost, v5 = self.subscriptions, self.vhost, self.v5
        assert isinstance(subs, Subscriptions5) and vhost is not None and v5 is not None
        limit = self.config.mqtt_max_subscribe_filters
        if len(requests) > limit:
            raise MQTTProtocolError(f"SUBSCRIBE with {len(requests)} topic filters, over mqtt_max_subscribe_filters "
                                    f"{limit}", reason=0x97)
        results = [subs.subscribe5(request) for request in requests]
        self.send(codec5.suback(packet_id, [code for code, _ in results]))
        v5.no_local = any(o.no_local for o in subs.options.values())
        source = self.host.retained.of(vhost)
        for request, (code, existed) in zip(requests, results, strict=True):
            if code < 0x80 and retained_for(request, existed):
                subs.queue_retained(source, request.topic_filter, code)

    # --- re-authentication (AUTH) ------------------------------------------------------------------
    def _auth5(self, body: bytes) -> None:
        v5 = self.v5
        assert v5 is not None
        request = reauthentication(body, v5.auth_method, v5.reauth is not None, self.username, self.peer_host)
        login = v5.reauth = self.broker.logins.attempt(request)
        self.host.start_task(self._await_reauth(login))  # the connection goes on meanwhile (4.12.1)

    async def _await_reauth(self, login: LoginAttempt) -> None:
        if login.delay:  # the throttle's, as for any login
            await asyncio.sleep(login.delay)
        outcome = login.decide_now()
        if outcome is None:
            outcome = await login.decide()
        self._handle(lambda: self._reauth_decided(login, outcome))

    def _reauth_decided(self, login: LoginAttempt, outcome: LoginOutcome) -> None:
        """As AMQP's update-secret: the same user, still allowed the vhost; the connection then ends at
        the new credential's expiry, its publishes and subscriptions checked with the new grants."""
        v5, vhost = self.v5, self.vhost
        if v5 is None or v5.reauth is not login or self.closed or vhost is None or v5.auth_method is None:
            return
        v5.reauth = None
        decided = self.broker.logins.secret_updated(outcome, vhost.name, self.username)
        if not decided.ok or decided.actor is None:
            self._fail(f"re-authentication refused: {decided.text}", NOT_AUTHORIZED)
            return
        decided.actor.client_id = self.client_id
        self.actor = decided.actor
        if self.subscriptions is not None:
            self.subscriptions.actor = decided.actor
        self._exchange = None  # the publish target is checked again
        self.login_outcome, self.expires_at = decided, decided.expires_at
        self.send(auth_success(v5.auth_method))
        self._effects.append(SetTimer(session_timer(self.keepalive * 1.5, self.expires_at)))
        log.info("MQTT connection %s (client %r): user %r re-authenticated", self.name, self.client_id, self.username)

    # --- ending ------------------------------------------------------------------------------------
    def _disconnect5(self, reason: int, props: dict[str, Any]) -> None:
        v5, subs = self.v5, self.subscriptions
        assert v5 is not None and isinstance(subs, Subscriptions5)
        expiry = props.get("session_expiry_interval")
        if expiry is not None:
            if v5.session_expiry == 0 and expiry:
                raise protocol_error("DISCONNECT sets a session expiry interval the CONNECT had as 0")
            v5.session_expiry = min(expiry, self.config.mqtt_max_session_expiry_interval)
            subs.set_session_expiry(v5.session_expiry)
        if reason != 0x04:  # "disconnect with will message" keeps the will
            self.will = None
        self._close()

    def _fail(self, reason: str, code: int = 0x80) -> None:
        v5 = self.v5
        if v5 is not None and not self.closed:
            if not v5.answered:
                self.send(self._connack(False, code, reason))
            elif self.connected:
                self.send(codec5.disconnect(code, self._reason_string(reason)))
        super()._fail(reason, code)

    def kick(self, reason: str, code: int = 0x98) -> None:
        if self.v5 is not None and self.connected and not self.closed:
            self.send(codec5.disconnect(code, self._reason_string(reason)))
        super().kick(reason, code)

    def _teardown(self, publish_will: bool) -> None:
        subs = self.subscriptions
        super()._teardown(publish_will)
        if isinstance(subs, Subscriptions5):
            subs.end()

    def _publish_will(self, will: codec.Will, properties: bytes | None = None) -> None:
        v5 = self.v5
        if v5 is None or self.vhost is None:
            return super()._publish_will(will, properties)
        properties = amqp_properties(will.qos, v5.will_properties, retain=will.retain)
        delay = min(v5.will_properties.get("will_delay_interval", 0), v5.session_expiry)
        if not delay:
            return super()._publish_will(will, properties)
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no event loop (in process): now
            return super()._publish_will(will, properties)
        try:
            self._target(will.topic)  # its topic permission, checked now: it may be published after a restart
        except (BrokerError, topics.TopicError) as e:
            log.info("MQTT client %r: its will was not published: %s", self.client_id, getattr(e, "text", e))
            return None
        vhost, host, counters = self.vhost, self.host, self.counters
        delayed = DelayedWill(now_ms() + delay * 1000, will.qos, will.retain, will.topic, properties, will.payload)
        state = vhost_state(vhost)
        state.will_delayed(self.client_id, delayed)
        schedule_will(state, self.client_id, delayed, lambda w: publish_will(
            vhost, self.config.mqtt_exchange, w, counters, host.retained))
        client_error_log.log(logging.DEBUG, "MQTT client %r: will delayed %d s", self.client_id, delay)
