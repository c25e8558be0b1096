"""One exchange federation link: a federated exchange of this node fed from one upstream.

On the upstream the link declares what RabbitMQ's federation plugin declares: the upstream exchange
(when missing, of the federated exchange's type), a durable queue ``federation: <exchange> -> <cluster
name>`` (x-internal-purpose federation, x-expires, x-message-ttl, x-queue-type), and an internal,
auto-delete exchange named after the queue with the suffix A or B, of type ``x-federation-upstream``
(x-max-hops, x-downstream-name, x-downstream-vhost) or ``fanout`` where the upstream does not know that
type. The queue is bound to it; it is bound to the upstream exchange with every binding of the
federated exchange (one per routing key and arguments), kept in step while the link runs. At each
start the other suffix's exchange is made and the old one deleted, so lost bindings come back; this
node's links on one upstream queue (turns.StartTurns) start one at a time, and a link removed for good
deletes the queue and its internal exchanges only as the last of them, and only while the queue has no
consumer (another node's link).

Messages consumed from the queue are published into the federated exchange here with the upstream's
routing key and an ``x-received-from`` entry (uri without password, exchange, redelivered,
cluster-name, vhost) in front of those already there. A message that already made ``max-hops`` hops
or already passed this cluster is acknowledged and dropped. The link stops on a connection loss and
starts again after reconnect-delay, doubled after each quick failure.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from pamqp import commands as spec

from lavinpy.wire.constants import NOT_FOUND, PRECONDITION_FAILED
from lavinpy.wire.field_table import Int64
from lavinpy.wire.properties import decode_properties, peek_headers, replace_field, replace_headers
from lavinpy.wire.uri import AMQPURL, load_tls, parse_url, shown_uri

from .client import LinkConnection, LinkError, connect, unchecked
from .turns import START_TURNS, TurnKey
from .upstream import Upstream

log = logging.getLogger("lavinpy.federation")

SYNC_SECONDS = 0.5  # how often the federated exchange's bindings are compared with the upstream's
STABLE_SECONDS = 30.0
MAX_BACKOFF = 12
STOP_SECONDS = 5.0
RECEIVED_FROM = "x-received-from"
BOUND_FROM = "x-bound-from"

BindingSpec = tuple[str, dict[str, Any]]


@dataclass
class LinkEnv:
    """What a link asks of this node (given by the server: the link itself talks over AMQP only)."""

    local_url: Callable[[str], AMQPURL]  # a URI of this node (amqp:// without host) -> how to log in
    cluster_name: Callable[[], str]
    exchange: Callable[[], dict[str, Any] | None]  # the federated exchange: type, durable, ... (None: gone)
    bindings: Callable[[], list[BindingSpec]]  # its bindings, as (routing key, arguments)
    refusal: Callable[[], str | None]  # why the creator may not run the link now, or None


def _now() -> str:
    return datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")


def _key(routing_key: str, arguments: Mapping[str, Any]) -> str:
    return json.dumps([routing_key, arguments], sort_keys=True, default=repr)


class Settlement:
    """Upstream deliveries republished here under confirms (ack-mode on-confirm), settled upstream in
    delivery order once this node confirms them: confirms may come singly and out of order (RabbitMQ
    downstream), a nack sends that delivery back to the upstream queue, and every run of acknowledged
    deliveries goes upstream as one ``basic.ack multiple`` (each earlier delivery tag on the channel is
    settled by then: dropped ones are acknowledged at once, the others are settled here in order)."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.pending: deque[tuple[int, int]] = deque()  # (publish sequence number here, upstream delivery tag)
        self.seq = 0
        self.answered: dict[int, bool] = {}  # confirmed, not yet settled (behind an unconfirmed one): -> nacked

    def published(self, tag: int) -> None:
        self.seq += 1
        self.pending.append((self.seq, tag))

    def confirmed(self, seq: int, multiple: bool, nack: bool) -> tuple[int | None, list[int]]:
        """(the upstream tag to acknowledge with multiple, or None; the upstream tags to nack first)."""
        if multiple:
            for s, _ in self.pending:  # the pending prefix up to seq: settled just below, so amortised O(1)
                if s > seq:
                    break
                self.answered.setdefault(s, nack)
        else:
            self.answered[seq] = nack
        ack: int | None = None
        nacks: list[int] = []
        while self.pending and self.pending[0][0] in self.answered:
            s, tag = self.pending.popleft()
            if self.answered.pop(s):
                nacks.append(tag)
            else:
                ack = tag
        return ack, nacks


class LinkRunner:
    """What an exchange link and a queue link share: the state the API shows, the reconnect loop with its
    backoff around a subclass's ``_session``, closing both connections, and the URLs of their URIs."""

    vhost: str
    upstream: Upstream
    env: Any  # a LinkEnv or a QueueEnv: ``refusal`` and ``local_url``
    described: str  # "federation link <what> in vhost <vhost>", for the log
    state: str
    error: str | None
    timestamp: str
    _up: LinkConnection | None
    _down: LinkConnection | None
    _settlement: Settlement
    uri: str | None
    failures = 0  # quick failures in a row: the next retry waits reconnect-delay * 2^(failures-1), at most 12x

    async def _session(self) -> None:
        raise NotImplementedError

    def _set_state(self, state: str, error: str | None = None) -> None:
        if state != self.state or error != self.error:
            self.state, self.error, self.timestamp = state, error, _now()

    async def run(self) -> None:
        failures = 0
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                reason = self.env.refusal()
                if reason is not None:
                    raise LinkError(reason)
                await self._session()
            except (LinkError, OSError, ValueError) as e:
                self._set_state("error", str(e))
                log.warning("%s (upstream %s): %s", self.described, self.upstream.name, e)
            except Exception as e:  # a fault of the link itself: reported and retried like any other
                self._set_state("error", f"internal error: {e!r}")
                log.exception("%s failed", self.described)
            await self._close()
            failures = 1 if loop.time() - started > STABLE_SECONDS else failures + 1
            self.failures = failures
            await asyncio.sleep(max(0.0, self.upstream.reconnect_delay) * min(2 ** (failures - 1), MAX_BACKOFF))
            self._set_state("starting")

    async def _close(self) -> None:
        up, down = self._up, self._down
        self._up = self._down = None
        for client in (up, down):
            if client is not None:
                try:
                    await client.close(1.0)
                except Exception:  # a half-dead connection: nothing left to do
                    client.abort()

    _safe: tuple[str | None, str] = (None, "")

    def _safe_uri(self) -> str:
        """The URI in use without its password (for every message's x-received-from: parsed once)."""
        if self._safe[0] != self.uri:
            self._safe = (self.uri, shown_uri(self.uri or "", None))
        return self._safe[1]

    def _confirmed(self, seq: int, multiple: bool, nack: bool) -> None:
        """This node's confirm of a republished message: settled upstream in order (Settlement)."""
        ack, nacks = self._settlement.confirmed(seq, multiple, nack)
        up = self._up
        if up is None:
            return
        for tag in nacks:
            up.nack(tag, False)  # refused here: back to the upstream queue
        if ack is not None:
            up.ack(ack, True)

    def _url(self, uri: str) -> AMQPURL:
        u = urlsplit(uri)
        try:
            return load_tls(self.env.local_url(uri) if u.scheme == "amqp" and not u.hostname else parse_url(uri))
        except ValueError as e:  # the TLS files: the status shows non-administrators no detail (links.py)
            raise LinkError(str(e)) from None



class ExchangeLink(LinkRunner):
    def __init__(self, vhost: str, exchange: str, upstream: Upstream, env: LinkEnv) -> None:
        self.vhost, self.exchange, self.upstream, self.env = vhost, exchange, upstream, env
        self.described = f"federation link {exchange} in vhost {vhost}"
        self.upstream_exchange = upstream.exchange or exchange
        self.state = "starting"
        self.error: str | None = None
        self.timestamp = _now()
        self.uri: str | None = None
        self.task: asyncio.Task[None] | None = None
        self.suffix = "A"
        self.received = self.forwarded = self.dropped = 0
        self._up: LinkConnection | None = None
        self._down: LinkConnection | None = None
        self._bound: dict[str, BindingSpec] = {}  # upstream bindings made, by key
        self._internal = ""
        self._upstream_cluster = ""
        self._upstream_vhost = "/"
        self._down_user = ""
        self._settlement = Settlement()
        self._turn: TurnKey | None = None  # the upstream queue this link uses, known to START_TURNS
        self._consumer_tag = ""

    # -------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(
            self.run(), name=f"federation {self.vhost}/{self.exchange} <- {self.upstream.name}")

    async def stop(self, cleanup: bool = False) -> None:
        """Stop the link; ``cleanup`` (its policy or upstream is gone, not a restart or a shutdown):
        delete its queue and internal exchanges upstream, as RabbitMQ does, so that nothing piles up there,
        unless another link still uses them: another of this node's links (START_TURNS), or a consumer of
        the queue (``_clean_upstream``)."""
        task = self.task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=STOP_SECONDS)
        key, self._turn = self._turn, None
        if key is None:
            await self._close()
            return
        others = START_TURNS.leave(key, self)
        if others:
            try:
                await self._close()
            finally:
                START_TURNS.closed(key)
            if cleanup:
                log.info("%s: upstream queue '%s' kept, %d other link(s) of this node use it",
                         self.described, key[2], others)
            return
        up = self._up
        if cleanup and up is not None and not up.closed.done() and self.state == "running":
            await START_TURNS.others_closed(key, STOP_SECONDS)  # their consumers would keep the queue in use
            try:
                async with START_TURNS.turn(key):  # no start of a link on the queue meanwhile
                    await self._clean_upstream(up, key[2])
            except LinkError as e:
                log.info("%s: upstream cleanup failed: %s", self.described, e)
        await self._close()

    async def _clean_upstream(self, up: LinkConnection, queue: str) -> None:
        """The upstream queue and its internal exchanges deleted, unless the queue has a consumer:
        a link of another node (links on one upstream exchange of one broker share its queue and internal
        exchanges), whose messages would otherwise be routed nowhere or deleted with the queue. The queue is
        deleted with if-unused (RabbitMQ refuses it with 406 while it has consumers) after this link's own
        consumer is cancelled; the exchange only once the queue is gone."""
        if self._consumer_tag:
            await up.rpc(spec.Basic.Cancel(consumer_tag=self._consumer_tag), spec.Basic.CancelOk,
                         timeout=STOP_SECONDS)
        try:
            await up.rpc(unchecked(spec.Queue.Delete, queue=queue, if_unused=True), spec.Queue.DeleteOk,
                         timeout=STOP_SECONDS)
        except LinkError as e:
            if e.reply_code == PRECONDITION_FAILED:  # the code, not the text: a name may hold "406"
                log.info("%s: upstream queue '%s' kept, another link consumes it", self.described, queue)
                return
            raise
        for suffix in "AB":  # the one in use may be the other link's, made at a start after this one's
            await self._delete_exchange(up, f"{queue} {suffix}")

    async def _connect_upstream(self) -> LinkConnection:
        errors = []
        for uri in self.upstream.uris:  # tried in turn, as RabbitMQ does
            try:
                client = await connect(self._url(uri), f"Federation link (upstream: {self.upstream.name}, "
                                                       f"policy: {self.exchange})")
            except LinkError as e:
                errors.append(str(e))
                continue
            self.uri = uri
            path = urlsplit(uri).path
            self._upstream_vhost = unquote(path[1:]) if len(path) > 1 else "/"
            return client
        raise LinkError("; ".join(errors))

    # --------------------------------------------------------------------- session

    async def _session(self) -> None:
        x = self.env.exchange()
        if x is None:
            raise LinkError(f"no exchange '{self.exchange}' in vhost '{self.vhost}'")
        self._settlement.clear()
        self._bound.clear()
        up = self._up = await self._connect_upstream()
        local = self.env.local_url(f"amqp:///{self.vhost}")
        self._down_user = local.user
        down = self._down = await connect(local, f"Federation link (downstream: {self.exchange})")
        cluster = up.server_properties.get("cluster_name")
        self._upstream_cluster = cluster if isinstance(cluster, str) else ""
        await self._ensure_upstream_exchange(up, x)
        queue = self.upstream.queue or self._queue_name()
        key = self.turn_key(queue)
        if key != self._turn:  # the queue is known to be in use by this link until it stops
            if self._turn is not None and START_TURNS.leave(self._turn, self):
                START_TURNS.closed(self._turn)  # its connection to that queue's broker is closed already
            START_TURNS.use(key, self)
            self._turn = key
        self._consumer_tag = ""
        async with START_TURNS.turn(key):  # links sharing the queue: one start at a time
            await self._make_internal(up, queue)
        if self.upstream.ack_mode == "on-confirm":
            await down.rpc(spec.Confirm.Select(), spec.Confirm.SelectOk)
            down.on_confirm = self._confirmed
        no_ack = self.upstream.ack_mode == "no-ack"
        if not no_ack:
            await up.rpc(spec.Basic.Qos(prefetch_count=self.upstream.prefetch_count), spec.Basic.QosOk)
        down.on_writable = lambda writable: up.pause_reading(not writable)
        up.on_message = self._deliver
        consumed = await up.rpc(unchecked(spec.Basic.Consume, queue=queue, no_ack=no_ack,
                                          consumer_tag=self.upstream.consumer_tag or ""), spec.Basic.ConsumeOk)
        self._consumer_tag = consumed.consumer_tag
        self._set_state("running")
        log.info("federation link %s in vhost %s running from upstream %s (%s)", self.exchange, self.vhost,
                 self.upstream.name, shown_uri(self.uri or "", None))
        while not (up.closed.done() or down.closed.done()):
            await asyncio.wait([asyncio.shield(up.closed), asyncio.shield(down.closed)], timeout=SYNC_SECONDS)
            if up.closed.done() or down.closed.done():
                break
            if self.env.exchange() is None:
                raise LinkError(f"no exchange '{self.exchange}' in vhost '{self.vhost}'")
            async with START_TURNS.turn(key):  # not while a start replaces the internal exchange
                current = START_TURNS.current(key)
                if current is not None and current != self._internal:
                    # Another link on the queue has started since and deleted this one's exchange: the
                    # bindings are kept on the new one (made again there: x-bound-from names the suffix).
                    self._internal, self.suffix = current, current[-1]
                    self._bound.clear()
                await self._sync_bindings(up)
        failed, side = (up, "upstream") if up.closed.done() else (down, "downstream")
        raise LinkError(f"{side}: {failed.error}")

    def turn_key(self, queue: str) -> TurnKey:
        """Which links' starts take turns with this one's (StartTurns): those on the same upstream queue."""
        u = urlsplit(self.uri or "")
        return self._upstream_cluster or f"{u.hostname}:{u.port}", self._upstream_vhost, queue

    async def _make_internal(self, up: LinkConnection, queue: str) -> None:
        """The upstream queue, and the internal exchange of the suffix not in use bound to it and to the
        upstream exchange (the one in use deleted once the new one carries the bindings)."""
        args: dict[str, Any] = {"x-internal-purpose": "federation"}
        if self.upstream.expires is not None:
            args["x-expires"] = Int64(self.upstream.expires)
        if self.upstream.message_ttl is not None:
            args["x-message-ttl"] = Int64(self.upstream.message_ttl)
        if self.upstream.queue_type != "classic":
            args["x-queue-type"] = self.upstream.queue_type
        await up.rpc(unchecked(spec.Queue.Declare, queue=queue, durable=True, arguments=args), spec.Queue.DeclareOk)
        # The suffix not in use upstream (this node may have restarted since it chose one): the exchange
        # that still carries the bindings is deleted only once the new one carries them too.
        old = "A" if await self._exchange_exists(f"{queue} A") else "B"
        if old == "A" and await self._exchange_exists(f"{queue} B"):
            # Both: a start cut short between making one and deleting the other. Either may be the one
            # the messages flow through (the other may have no binding yet), so A is made to carry every
            # binding before B is made anew; deleting B first would drop what is published meanwhile.
            self.suffix, self._internal = "A", f"{queue} A"
            await self._carry_bindings(up, queue)
        self.suffix = "B" if old == "A" else "A"
        self._internal = f"{queue} {self.suffix}"
        await self._declare_internal(up, self._internal)
        await self._carry_bindings(up, queue)
        await self._delete_exchange(up, f"{queue} {old}")
        if self._turn is not None:
            START_TURNS.made(self._turn, self._internal)

    async def _carry_bindings(self, up: LinkConnection, queue: str) -> None:
        """The internal exchange in use bound to the queue and to the upstream exchange with every
        binding (binding again what is already bound changes nothing)."""
        self._bound.clear()
        await up.rpc(unchecked(spec.Queue.Bind, queue=queue, exchange=self._internal), spec.Queue.BindOk)
        await self._sync_bindings(up)

    def _queue_name(self) -> str:
        down = ""
        if self._upstream_vhost != self.vhost:
            down = f":{self.vhost}:{self.exchange}"
        elif self.upstream_exchange != self.exchange:
            down = f":{self.exchange}"
        return f"federation: {self.upstream_exchange} -> {self.env.cluster_name()}{down}"

    async def _exchange_exists(self, name: str) -> bool:
        """Whether the upstream has that exchange (a passive declare on a connection of its own)."""
        probe = await connect(self._url(self.uri or ""), "Federation link (check)")
        try:
            await probe.rpc(unchecked(spec.Exchange.Declare, exchange=name, passive=True), spec.Exchange.DeclareOk)
            return True
        except LinkError as e:
            # Only the broker's 404 says it is missing: a lost or timed-out probe says nothing, and taking
            # it for "missing" would make the link delete the internal exchange that carries the bindings
            # (messages published meanwhile would be dropped upstream).
            if e.reply_code == NOT_FOUND:  # the code, not the text: a name may hold "404"
                return False
            raise
        finally:
            await probe.close(1.0)

    async def _ensure_upstream_exchange(self, up: LinkConnection, x: Mapping[str, Any]) -> None:
        """The upstream exchange, declared like the federated one where it is missing."""
        if await self._exchange_exists(self.upstream_exchange):
            return
        await up.rpc(unchecked(spec.Exchange.Declare, exchange=self.upstream_exchange, exchange_type=x["type"],
                                           durable=x["durable"], auto_delete=x["auto_delete"],
                                           internal=x["internal"], arguments=x["arguments"] or None),
                     spec.Exchange.DeclareOk)

    async def _declare_internal(self, up: LinkConnection, name: str) -> None:
        """The internal upstream exchange: x-federation-upstream where the upstream has it, else fanout
        (tried on a connection of its own: an unknown type closes the connection)."""
        await self._delete_exchange(up, name)
        purpose: dict[str, Any] = {"x-internal-purpose": "federation"}
        probe = await connect(self._url(self.uri or ""), "Federation link (declare)")
        try:
            await probe.rpc(unchecked(
                spec.Exchange.Declare, exchange=name, exchange_type="x-federation-upstream", durable=True,
                auto_delete=True,
                internal=True, arguments={"x-max-hops": Int64(self.upstream.max_hops),
                                          "x-downstream-name": self.env.cluster_name(),
                                          "x-downstream-vhost": self.vhost, **purpose}), spec.Exchange.DeclareOk)
            return
        except LinkError:
            pass
        finally:
            await probe.close(1.0)
        await up.rpc(unchecked(spec.Exchange.Declare, exchange=name, exchange_type="fanout", durable=True,
                               auto_delete=True, internal=True, arguments=purpose), spec.Exchange.DeclareOk)

    @staticmethod
    async def _delete_exchange(up: LinkConnection, name: str) -> None:
        try:
            await up.rpc(unchecked(spec.Exchange.Delete, exchange=name), spec.Exchange.DeleteOk)
        except LinkError:
            if up.closed.done():
                raise
            await up.reopen_channel()  # an upstream that answers 404 for a missing exchange

    # -------------------------------------------------------------------- bindings

    def _wanted(self) -> dict[str, BindingSpec]:
        wanted: dict[str, BindingSpec] = {}
        for routing_key, arguments in self.env.bindings():
            args = self._propagated(arguments)
            if args is not None:
                wanted[_key(routing_key, args)] = (routing_key, args)
        return wanted

    def _propagated(self, arguments: Mapping[str, Any]) -> dict[str, Any] | None:
        """The arguments a binding is made with upstream (an x-bound-from entry counting the hops it may
        still travel), or None when it travels no further."""
        args = dict(arguments)
        previous = args.get(BOUND_FROM)
        hops = self.upstream.max_hops
        if isinstance(previous, list) and previous and isinstance(previous[0], Mapping):
            seen = any(isinstance(e, Mapping) and e.get("cluster-name") == self._upstream_cluster
                       for e in previous)
            hops = 0 if seen else min(int(previous[0].get("hops", 1)) - 1, hops)
        if hops <= 0:
            return None
        entry = {"cluster-name": self.env.cluster_name(), "vhost": self.vhost,
                 "exchange": f"{self.vhost}:{self.exchange} {self.suffix}", "hops": hops}
        args[BOUND_FROM] = [entry, *(previous if isinstance(previous, list) else [])]
        return args

    async def _sync_bindings(self, up: LinkConnection) -> None:
        wanted = self._wanted()
        nowait = self.upstream.bind_nowait
        for key in [k for k in self._bound if k not in wanted]:
            routing_key, args = self._bound.pop(key)
            await self._call(up, unchecked(spec.Exchange.Unbind, destination=self._internal,
                                           source=self.upstream_exchange, routing_key=routing_key, arguments=args),
                             spec.Exchange.UnbindOk, False)
        for key, (routing_key, args) in wanted.items():
            if key not in self._bound:
                await self._call(up, unchecked(spec.Exchange.Bind, destination=self._internal,
                                               source=self.upstream_exchange, routing_key=routing_key,
                                               arguments=args, nowait=nowait),
                                 spec.Exchange.BindOk, nowait)
                self._bound[key] = (routing_key, args)

    @staticmethod
    async def _call(up: LinkConnection, method: Any, reply: type, nowait: bool) -> None:
        if nowait:
            up.send(method)
        else:
            await up.rpc(method, reply)

    # -------------------------------------------------------------------- messages

    def _deliver(self, tag: int, redelivered: bool, exchange: str, routing_key: str, properties: bytes,
                 body: bytes) -> None:
        up, down = self._up, self._down
        if up is None or down is None:
            return  # left unacked: the upstream requeues it when the connection closes
        self.received += 1
        headers = peek_headers(properties) or {}
        trail = headers.get(RECEIVED_FROM)
        trail = list(trail) if isinstance(trail, list) else []
        me = (self.env.cluster_name(), self.vhost)
        if len(trail) >= self.upstream.max_hops or any(
                isinstance(e, Mapping) and (e.get("cluster-name"), e.get("vhost")) == me for e in trail):
            self.dropped += 1  # a loop, or past max-hops: RabbitMQ's upstream exchange would not route it
            if self.upstream.ack_mode != "no-ack":
                up.ack(tag, False)
            return
        entry: dict[str, Any] = {"uri": self._safe_uri(), "exchange": self.upstream_exchange,
                                 "redelivered": redelivered}
        if self._upstream_cluster:
            entry["cluster-name"] = self._upstream_cluster
        entry["vhost"] = self._upstream_vhost
        headers[RECEIVED_FROM] = [entry, *trail]
        properties = replace_headers(properties, headers)
        # lavinpy checks a user_id against the publishing user (it has no impersonator tag): one it would
        # refuse is cleared even with trust-user-id, or the message would stop the link at each redelivery.
        if not self.upstream.trust_user_id or decode_properties(properties).user_id not in (None, self._down_user):
            properties = replace_field(properties, "user_id", None)
        down.publish(self.exchange, routing_key, properties, body)
        self.forwarded += 1
        if self.upstream.ack_mode == "on-confirm":
            self._settlement.published(tag)
        elif self.upstream.ack_mode == "on-publish":
            up.ack(tag, False)

    # ---------------------------------------------------------------------- status

    def status(self, node: str, link_id: str) -> dict[str, Any]:
        """The link as RabbitMQ's /api/federation-links lists it."""
        info: dict[str, Any] = {
            "node": node, "exchange": self.exchange, "upstream_exchange": self.upstream_exchange,
            "type": "exchange", "vhost": self.vhost, "upstream": self.upstream.name, "id": link_id,
            "status": self.state, "timestamp": self.timestamp,
            "uri": shown_uri(self.uri or self.upstream.uris[0], None),
            "local_connection": f"Federation link (downstream: {self.exchange})",
            "messages_received": self.received, "messages_forwarded": self.forwarded,
            "messages_dropped": self.dropped, "bindings": len(self._bound),
        }
        if self.state == "running":
            info["queue"] = self.upstream.queue or self._queue_name()
        if self.state == "error":
            info["error"] = self.error or ""
            info["failures"] = self.failures
        return info
