"""A connection's logins through the model's one login operation (broker/login.py): the handshake's
(connection.start with the mechanisms offered, then start-ok) and a running connection's new secret
(connection.update-secret).

While a login is decided (the throttle's delay, a slow hash in the worker pool) the connection reads
and handles nothing more; what it had read waits, and runs once the answer is sent. A new secret of
a token's login is checked as a login of the connection's user: accepted, the user must still reach
the vhost and the connection gets update-secret-ok, then a basic.cancel for each consumer of a queue
the new token may no longer read; refused, it is closed with 530 as RabbitMQ closes it. A login whose
credentials do not expire (a password, a directory, a certificate) takes any new secret as it is and
gets update-secret-ok at once, as RabbitMQ's backends whose state cannot expire do.

A credential that expires (a token's ``exp``) closes the connection then, with RabbitMQ's 320
``credential expired``, unless an update-secret brought a newer token first: its scopes replace
the old ones and its expiry the old one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from pamqp import commands

from .. import __version__
from ..broker.ops import LoginAttempt, LoginOutcome, LoginRequest
from ..broker.ops.node_info import node_name
from ..wire import writer
from ..wire.constants import ACCESS_REFUSED, CONNECTION_FORCED, NOT_ALLOWED
from .connection_states import AWAIT_START_OK, AWAIT_TUNE_OK, CLOSED, CLOSING, OPEN
from .effects import CancelTimer, SetTimer, TimerKind
from .sasl import login_request, offered_mechanisms

if TYPE_CHECKING:
    from ..broker.ops import Actor, Broker, PeerCertificate, VHost
    from ..config import Config
    from ..wire.reader import FrameReader
    from .channel import Channel
    from .output import ConnectionEffect

log = logging.getLogger("lavinpy.connection")

PROTOCOL = "AMQP 0-9-1"
_UPDATE_SECRET_IDS = (10, 70)  # connection.update-secret's class and method ids, named in its refusal
CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "direct_reply_to": True,
    "consumer_priorities": True,  # x-priority on basic.consume (RabbitMQ's queue federation asks for it)
}


class LoginFlow:
    """AMQPConnection's logins (a mixin: the connection holds the state)."""

    if not TYPE_CHECKING:  # the connection's slots hold the state (mypy sees the attributes below)
        __slots__ = ()
    else:
        broker: Broker
        config: Config
        name: str
        peer_host: str | None
        peer_certificate: PeerCertificate | None
        auth_mechanism: str
        login_outcome: LoginOutcome | None
        username: str
        vhost: VHost | None
        actor: Actor | None
        state: int
        channels: dict[int, Channel]
        client_properties: dict
        input_held: bool
        driver: Any
        recv_oct: int
        recv_cnt: int
        _login: LoginAttempt | None
        _held_frames: list[Any]
        _held_input: list[bytes]
        reader: FrameReader

        def update_reading(self) -> None: ...
        def effect(self, effect: ConnectionEffect) -> None: ...
        def start_task(self, work: Coroutine[Any, Any, None]) -> None: ...
        def abort(self) -> None: ...
        def send(self, data: bytes) -> None: ...
        def enter_state(self, state: int) -> None: ...
        def close(self, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None: ...
        def receive_data(self, data: bytes, resumed: bool = False) -> None: ...
        def _run_frames(self, frames: list[Any], nbytes: int) -> None: ...

    def greet(self) -> None:
        """Send connection.start once the protocol header has arrived."""
        self.enter_state(AWAIT_START_OK)
        self.send(writer.method_frame(0, commands.Connection.Start(
            version_major=0, version_minor=9,
            server_properties={"product": "lavinpy", "version": __version__, "platform": "Python",
                               "information": "AMQP 0-9-1 broker with LavinMQ-style storage",
                               "copyright": "lavinpy developers", "capabilities": dict(CAPABILITIES),
                               "cluster_name": self.broker.parameters.get_global("cluster_name") or node_name()},
            mechanisms=" ".join(offered_mechanisms(self.config, self.peer_certificate)), locales="en_US")))

    def _on_start_ok(self, method: commands.Connection.StartOk) -> None:
        self.client_properties = dict(method.client_properties or {})
        self.auth_mechanism = method.mechanism
        request = login_request(self.config, method.mechanism, method.response, self.peer_certificate, self.peer_host)
        # The model's one login operation: the throttle's delay, the auth backends (a slow hash in its
        # worker pool), the loopback-only rule. Until it is decided the connection reads nothing more:
        # a client that sent StartOk, TuneOk and Open in one write gets 403 or its Tune.
        self._begin_login(request)

    def on_update_secret(self, method: commands.Connection.UpdateSecret) -> None:
        """A new secret for the connection's user: a token's is decided as that user's login with it as
        the password; a login whose credentials do not expire (a password's) takes it as it is."""
        secret = method.new_secret
        if isinstance(secret, bytes | bytearray):
            secret = bytes(secret).decode("utf-8", "replace")
        log.debug("connection %s of user %r: asked to update secret, reason: %s", self.name, self.username,
                  method.reason)
        if not self.broker.logins.decides_new_secret(self.login_outcome):
            self.send(writer.method_frame(0, commands.Connection.UpdateSecretOk()))
            log.info("connection %s: user %r updated secret, reason: %s", self.name, self.username, method.reason)
            return
        self._begin_login(LoginRequest(PROTOCOL, "update-secret", self.username, str(secret), self.peer_host))

    def _begin_login(self, request: LoginRequest) -> None:
        login = self._login = self.broker.logins.attempt(request)
        self.input_held = True
        self.update_reading()
        if login.delay:  # answered later, right or wrong, without holding anyone else up
            self.effect(SetTimer(TimerKind.LOGIN, login.delay))
        else:
            self._decide_login(login)

    def _decide_login(self, login: LoginAttempt) -> None:
        outcome = login.decide_now()
        if outcome is None:
            self.start_task(self._await_login(login))
        else:
            self._login_decided(login, outcome)

    async def _await_login(self, login: LoginAttempt) -> None:
        try:
            outcome = await login.decide()
        except Exception:  # the pool is gone (the broker is stopping)
            log.exception("connection %s: the login was not decided", self.name)
            self.abort()
            return
        self._login_decided(login, outcome)
        if self.driver is not None:
            self.driver.pump()

    def _login_decided(self, login: LoginAttempt, outcome: LoginOutcome) -> None:
        """The login's answer, then the input held meanwhile."""
        if self._login is not login:
            return  # the client went away meanwhile
        self._login = None
        self.input_held = False
        self.update_reading()
        if self.state == OPEN:
            self._secret_decided(outcome)
        elif self.state != AWAIT_START_OK:
            return
        elif outcome.ok:
            self.username = outcome.username
            self.login_outcome = outcome
            self._expire_at(outcome.expires_at)
            self.enter_state(AWAIT_TUNE_OK)
            self.send(writer.method_frame(0, commands.Connection.Tune(
                channel_max=self.config.channel_max, frame_max=self.config.frame_max,
                heartbeat=self.config.heartbeat)))
        else:  # logged by the login (the throttle's summary, the loopback rule)
            self.close(ACCESS_REFUSED, outcome.text)
        self._run_held()

    def _run_held(self) -> None:
        """The frames and input held while a login was decided or the other clients had their turn."""
        frames, self._held_frames = self._held_frames, []
        if frames:
            self._run_frames(frames, 0)
        held, self._held_input = self._held_input, []
        if self._login is not None or self._held_frames or self.state >= CLOSED:
            self._held_input = held + self._held_input
        elif held or self.reader.undecoded:
            self.recv_oct -= sum(map(len, held))  # counted when they arrived
            self.recv_cnt -= 1
            self.receive_data(b"".join(held), resumed=True)  # behind the rest of a read left undecoded

    def _secret_decided(self, outcome: LoginOutcome) -> None:
        assert self.vhost is not None
        decided = self.broker.logins.secret_updated(outcome, self.vhost.name, self.username)
        if not decided.ok:
            self.close(NOT_ALLOWED, decided.text, *_UPDATE_SECRET_IDS)
            return
        self.actor = decided.actor
        self.login_outcome = decided
        self._expire_at(decided.expires_at)
        for channel in self.channels.values():  # its publish target is resolved and checked again
            channel._publish_generation = -1
        self.send(writer.method_frame(0, commands.Connection.UpdateSecretOk()))
        log.info("connection %s: user %r updated secret", self.name, self.username)
        self._cancel_unreadable_consumers()

    def _cancel_unreadable_consumers(self) -> None:
        """Consumers of queues the new secret may no longer read are cancelled by the server (a
        basic.cancel to a client that takes consumer_cancel_notify), as RabbitMQ 4.1 detaches an AMQP
        1.0 consuming link when a renewed token loses read access to its queue."""
        actor, vhost = self.actor, self.vhost
        assert actor is not None and vhost is not None
        for channel in list(self.channels.values()):
            for consumer in list(channel.consumers.values()):
                queue = consumer.queue
                if not actor.allowed("read", "queue", queue.name, vhost.name):
                    log.warning("connection %s: consumer %r of queue %r cancelled: user %r may no longer read it",
                                self.name, consumer.tag, queue.name, self.username)
                    queue.remove_consumer(consumer, notify=True)

    def _expire_at(self, expires_at: float | None) -> None:
        """The credential's expiry (epoch seconds) ends the connection then (None: never)."""
        if expires_at is None:
            self.effect(CancelTimer(TimerKind.CREDENTIAL))
        else:
            self.effect(SetTimer(TimerKind.CREDENTIAL, max(0.0, expires_at - time.time())))

    def credential_expired(self) -> None:
        """RabbitMQ's close of a connection whose credential expired (320, ``credential expired``)."""
        if self.state >= CLOSING:
            return
        log.warning("closing AMQP connection %s of user %r: credential has expired", self.name, self.username)
        self.close(CONNECTION_FORCED, "CONNECTION_FORCED - credential expired")
