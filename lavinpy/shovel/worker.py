"""One running shovel: consume from the source, publish to the destination, settle the source.

With ``on-confirm`` a source message is acked only once the destination confirmed its copy, so
killing either broker loses nothing (the unacked ones are redelivered: duplicates are possible).
``on-publish`` acks as soon as the copy is written, ``no-ack`` consumes without acks. After a
failure the shovel is ``terminated`` with the reason and tries again after ``reconnect-delay``,
doubled on each failure in a row (at most eight times the delay); 0 means it stays terminated.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from pamqp import commands as spec

from lavinpy.progress import Progress
from lavinpy.wire.field_table import Int64, encode_table
from lavinpy.wire.frames import build_method
from lavinpy.wire.properties import append_header_entry, replace_field
from lavinpy.wire.shortstr import fit_shortstr
from lavinpy.wire.uri import AMQPURL, load_tls, parse_url, shown_uri

from .client import ShovelClient, ShovelClientError, connect
from .definition import ShovelDefinition, is_local

log = logging.getLogger("lavinpy.shovel")
PROGRESS_MIN_MESSAGES = 1000  # a smaller move logs no progress

MAX_BACKOFF = 8  # the longest wait is this many reconnect-delays
STABLE_SECONDS = 30.0  # running this long resets the backoff
STOP_SECONDS = 3.0
DRAIN_SECONDS = 3.0  # a stop waits this long at most for the destination's confirms of what it forwarded

LocalURL = Callable[[str, str], AMQPURL]  # (uri without host, the shovel's vhost) -> where the local node listens


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")


class ShovelDone(Exception):
    """src-delete-after reached: the shovel has moved what it was asked to move."""


class Shovel:
    """One dynamic shovel; ``run`` loops until cancelled or done (then ``on_done`` is called)."""

    def __init__(self, vhost: str, name: str, definition: ShovelDefinition, local_url: LocalURL,
                 on_done: Callable[[Shovel], None] | None = None,
                 refusal: Callable[[], str | None] | None = None) -> None:
        """``refusal``: asked before each start; a text (its creator may not run it now) terminates it."""
        self.vhost, self.name, self.definition = vhost, name, definition
        self._local_url = local_url
        self._on_done = on_done
        self._refusal = refusal
        self.state = "starting"
        self.reason: str | None = None
        self.timestamp = _now()
        self.forwarded = 0  # published to the destination (RabbitMQ 3.12's "forwarded")
        self.confirmed = 0  # settled at the source after the destination took them
        self.src_uri = definition.src_uris[0]
        self.dest_uri = definition.dest_uris[0]
        self.remaining: int | None = None  # left to move under src-delete-after
        self._moving: Progress | None = None
        self.task: asyncio.Task[None] | None = None
        self._src: ShovelClient | None = None
        self._dest: ShovelClient | None = None
        self._outstanding: deque[tuple[int, int]] = deque()  # (destination seq, source tag), in order
        self._seq = 0
        self._confirmed_upto = 0
        self._single_confirms: set[int] = set()
        self._nacked: set[int] = set()
        self._allowed = -1  # messages this session may still forward (-1: no limit)
        self._no_ack = False  # consuming without acks (ack-mode no-ack and no src-delete-after)
        self._done = asyncio.Event()

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self.run(), name=f"shovel {self.vhost}/{self.name}")

    async def stop(self) -> None:
        task = self.task
        if task is not None and not task.done():
            await self._drain()
            task.cancel()
            # Bounded: a connect stuck in a TLS handshake must not hold up the broker's shutdown.
            await asyncio.wait({task}, timeout=STOP_SECONDS)
        await self._close()

    async def _drain(self) -> None:
        """Before a stop: take no more deliveries and wait (bounded) for the destination to confirm what
        was forwarded, so that each is acked at the source instead of being requeued there and moved a
        second time when the shovel starts again (a restart, a new definition, the node's shutdown)."""
        src, dest = self._src, self._dest
        if src is None or dest is None or not self._outstanding:
            return
        dest.on_writable = None  # (its writability would resume the source's reading)
        src.pause_reading(True)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DRAIN_SECONDS
        while self._outstanding and loop.time() < deadline and not src.closed.done() and not dest.closed.done():
            await asyncio.sleep(0.01)

    def _set_state(self, state: str, reason: str | None = None) -> None:
        if state != self.state or reason != self.reason:
            self.state, self.reason, self.timestamp = state, reason, _now()

    async def run(self) -> None:
        failures = 0
        definition = self.definition
        while True:
            started = asyncio.get_running_loop().time()
            try:
                reason = self._refusal() if self._refusal is not None else None
                if reason is not None:
                    raise ShovelClientError(reason)
                await self._session()
            except ShovelDone:
                await self._close()
                log.info("shovel %s in vhost %s moved its messages and is removed", self.name, self.vhost)
                if self._on_done is not None:
                    self._on_done(self)
                return
            except (ShovelClientError, OSError, ValueError) as e:
                self._set_state("terminated", str(e))
                log.warning("shovel %s in vhost %s terminated: %s", self.name, self.vhost, e)
            except Exception as e:  # a fault of the shovel itself: reported and retried like any other
                self._set_state("terminated", f"internal error: {e!r}")
                log.exception("shovel %s in vhost %s failed", self.name, self.vhost)
            await self._close()
            if definition.reconnect_delay <= 0:
                return
            failures = 1 if asyncio.get_running_loop().time() - started > STABLE_SECONDS else failures + 1
            await asyncio.sleep(definition.reconnect_delay * min(2 ** (failures - 1), MAX_BACKOFF))
            self._set_state("starting")

    async def _close(self) -> None:
        src, dest = self._src, self._dest
        self._src = self._dest = None
        for client in (src, dest):
            if client is not None:
                try:
                    await client.close(1.0)
                except Exception:  # closing a half-dead connection: nothing left to do
                    client.abort()

    def _url(self, uri: str) -> AMQPURL:
        try:
            return load_tls(self._local_url(uri, self.vhost) if is_local(uri) else parse_url(uri))
        except ValueError as e:  # the TLS files: the status shows non-administrators no detail (links.py)
            raise ShovelClientError(str(e)) from None

    async def _connect(self, uris: tuple[str, ...], side: str) -> tuple[ShovelClient, str]:
        errors = []
        for uri in uris:  # several URIs are tried in turn, as RabbitMQ does
            try:
                return await connect(self._url(uri), f"Shovel {self.name} ({side})"), uri
            except ShovelClientError as e:
                errors.append(str(e))
        raise ShovelClientError(f"{side}: " + "; ".join(errors))

    # ------------------------------------------------------------------ session

    async def _session(self) -> None:
        d = self.definition
        self._outstanding.clear()
        self._seq = self._confirmed_upto = 0
        self._single_confirms.clear()
        self._nacked.clear()
        self._done.clear()
        src, self.src_uri = await self._connect(d.src_uris, "source")
        self._src = src
        dest, self.dest_uri = await self._connect(d.dest_uris, "destination")
        self._dest = dest
        await self._declare_destination(dest)
        queue = await self._declare_source(src)
        if self.remaining == 0:
            raise ShovelDone()
        self._allowed = self.remaining if self.remaining is not None else -1
        if d.ack_mode == "on-confirm":
            await dest.rpc(spec.Confirm.Select(), spec.Confirm.SelectOk)
            dest.on_confirm = self._confirmed
        prefetch = d.prefetch_count if self._allowed < 0 else max(1, min(d.prefetch_count, self._allowed))
        # no-ack with src-delete-after still takes acks (at once, as on-publish): without a prefetch limit
        # the source would push messages past the count, and those would be lost.
        self._no_ack = d.ack_mode == "no-ack" and self._allowed < 0
        if not self._no_ack:
            await src.rpc(spec.Basic.Qos(prefetch_count=prefetch), spec.Basic.QosOk)
        dest.on_writable = lambda writable: src.pause_reading(not writable)
        src.on_delivery = self._deliver
        await src.rpc(build_method(spec.Basic.Consume, queue=queue, consumer_tag=fit_shortstr(f"shovel-{self.name}"),
                                         no_ack=self._no_ack, arguments=d.src_consumer_args or None),
                      spec.Basic.ConsumeOk)
        self._set_state("running")
        log.info("shovel %s in vhost %s running: %s -> %s", self.name, self.vhost, shown_uri(self.src_uri),
                 shown_uri(self.dest_uri))
        waiters: list[asyncio.Future[Any]] = [asyncio.ensure_future(asyncio.shield(c.closed)) for c in (src, dest)]
        waiters.append(asyncio.ensure_future(self._done.wait()))
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for fut in waiters:
                fut.cancel()
        if self._done.is_set() and not self._outstanding:
            raise ShovelDone()
        failed = src if src.closed.done() else dest
        raise ShovelClientError(f"{'source' if failed is src else 'destination'}: {failed.error}")

    async def _passive(self, client: ShovelClient, method: Any, reply: type, what: str) -> Any:
        try:
            return await client.rpc(method, reply)
        except ShovelClientError as e:
            if client.transport is None or client.transport.is_closing():
                raise
            await client.reopen_channel()
            raise _NotFound(f"{what}: {e}") from None

    async def _declare_source(self, src: ShovelClient) -> str:
        d = self.definition
        if d.src_queue is not None:
            if d.src_queue_args is not None:
                ok = await src.rpc(build_method(spec.Queue.Declare, queue=d.src_queue, durable=True,
                                                arguments=d.src_queue_args),
                                   spec.Queue.DeclareOk)
            else:
                try:
                    ok = await self._passive(src, build_method(spec.Queue.Declare, queue=d.src_queue, passive=True),
                                             spec.Queue.DeclareOk, f"source queue '{d.src_queue}'")
                except _NotFound as e:
                    raise ShovelClientError(str(e)) from None
            if self.remaining is None:
                if d.delete_after == "queue-length":
                    self._to_move(ok.message_count)
                elif isinstance(d.delete_after, int):
                    self._to_move(d.delete_after)
            return d.src_queue
        assert d.src_exchange is not None
        if d.src_exchange:
            try:
                await self._passive(src, build_method(spec.Exchange.Declare, exchange=d.src_exchange, passive=True),
                                    spec.Exchange.DeclareOk, f"source exchange '{d.src_exchange}'")
            except _NotFound as e:
                raise ShovelClientError(str(e)) from None
        ok = await src.rpc(build_method(spec.Queue.Declare, queue="", exclusive=True, auto_delete=True),
                           spec.Queue.DeclareOk)
        await src.rpc(build_method(spec.Queue.Bind, queue=ok.queue, exchange=d.src_exchange,
                                   routing_key=d.src_exchange_key),
                      spec.Queue.BindOk)
        if self.remaining is None and isinstance(d.delete_after, int):
            self._to_move(d.delete_after)
        return ok.queue

    def _to_move(self, count: int) -> None:
        """src-delete-after: count messages to move, then stop; the log says how far it got every 10 %."""
        self.remaining = count
        self._moving = Progress(f"shovel {self.name} in vhost {self.vhost} moving messages", count,
                                unit="messages", log=log, min_total=PROGRESS_MIN_MESSAGES)

    async def _declare_destination(self, dest: ShovelClient) -> None:
        d = self.definition
        if d.dest_queue:
            try:
                await self._passive(dest, build_method(spec.Queue.Declare, queue=d.dest_queue, passive=True),
                                    spec.Queue.DeclareOk, f"destination queue '{d.dest_queue}'")
            except _NotFound:  # as RabbitMQ: a missing destination queue is declared durable
                await dest.rpc(build_method(spec.Queue.Declare, queue=d.dest_queue, durable=True,
                                            arguments=d.dest_queue_args),
                               spec.Queue.DeclareOk)
        elif d.dest_exchange:
            try:
                await self._passive(dest, build_method(spec.Exchange.Declare, exchange=d.dest_exchange, passive=True),
                                    spec.Exchange.DeclareOk, f"destination exchange '{d.dest_exchange}'")
            except _NotFound as e:
                raise ShovelClientError(str(e)) from None

    # -------------------------------------------------------------- the flow

    def _deliver(self, tag: int, exchange: str, routing_key: str, properties: bytes, body: bytes) -> None:
        src, dest, d = self._src, self._dest, self.definition
        if src is None or dest is None or self._allowed == 0 or dest.transport is None or dest.transport.is_closing():
            return  # past src-delete-after or no destination: left unacked, the source requeues it on close
        if d.dest_queue:
            target_exchange, target_key = "", d.dest_queue
        elif d.dest_exchange is not None:
            target_exchange = d.dest_exchange
            target_key = d.dest_exchange_key if d.dest_exchange_key is not None else routing_key
        else:
            target_exchange, target_key = exchange, routing_key
        if d.publish_properties or d.add_forward_headers or d.add_timestamp_header:
            properties = self._rewrite(properties, exchange, routing_key)
        dest.publish(target_exchange, target_key, properties, body)
        self.forwarded += 1
        if self._allowed > 0:
            self._allowed -= 1
        if d.ack_mode == "on-confirm":
            self._seq += 1
            self._outstanding.append((self._seq, tag))
        else:
            if not self._no_ack:
                src.ack(tag, False)
            self._settled(1)

    def _rewrite(self, properties: bytes, exchange: str, routing_key: str) -> bytes:
        d = self.definition
        for name, value in d.publish_properties.items():
            properties = replace_field(properties, name, value)
        if d.add_forward_headers:
            # RabbitMQ's x-shovelled header: one table per hop, naming the shovel and both ends.
            hop = {"shovel-type": "dynamic", "shovel-name": self.name, "shovel-vhost": self.vhost,
                   "src-uri": shown_uri(self.src_uri), "dest-uri": shown_uri(self.dest_uri),
                   "src-exchange": exchange, "src-exchange-key": routing_key}
            if self.definition.src_queue is not None:
                hop["src-queue"] = self.definition.src_queue
            properties = append_header_entry(properties, _entry("x-shovelled", [hop]))
        if d.add_timestamp_header:
            stamp = int(datetime.datetime.now(datetime.UTC).timestamp())
            properties = append_header_entry(properties, _entry("x-shovelled-timestamp", Int64(stamp)))
        return properties

    def _confirmed(self, tag: int, multiple: bool, nack: bool) -> None:
        if multiple:
            if nack:
                self._nacked.update(s for s, _ in self._outstanding if self._confirmed_upto < s <= tag)
            self._confirmed_upto = max(self._confirmed_upto, tag)
        else:
            self._single_confirms.add(tag)
            if nack:
                self._nacked.add(tag)
        src = self._src
        outstanding = self._outstanding
        last_ack = 0
        settled = 0
        while outstanding:
            seq, src_tag = outstanding[0]
            if seq > self._confirmed_upto and seq not in self._single_confirms:
                break
            outstanding.popleft()
            self._single_confirms.discard(seq)
            if seq in self._nacked:
                # The destination refused it: give it back to the source (requeued), as RabbitMQ does.
                self._nacked.discard(seq)
                if src is not None:
                    if last_ack:
                        src.ack(last_ack, True)
                        last_ack = 0
                    src.nack(src_tag, False)
                self.forwarded -= 1
                if self._allowed >= 0:
                    self._allowed += 1
                continue
            last_ack = src_tag
            settled += 1
        if last_ack and src is not None:
            src.ack(last_ack, True)
        if settled:
            self._settled(settled)

    def _settled(self, count: int) -> None:
        self.confirmed += count
        if self._moving is not None:
            self._moving.advance(count)
        if self.remaining is not None:
            self.remaining = max(0, self.remaining - count)
            if self.remaining == 0 and not self._outstanding:
                self._done.set()

    # ------------------------------------------------------------------ status

    def status(self, node: str) -> dict[str, Any]:
        """The shovel as RabbitMQ's /api/shovels lists it (3.12+ counters included)."""
        d = self.definition
        info: dict[str, Any] = {
            "node": node, "timestamp": self.timestamp, "name": self.name, "vhost": self.vhost, "type": "dynamic",
            "state": self.state, "src_uri": shown_uri(self.src_uri), "dest_uri": shown_uri(self.dest_uri),
            "src_protocol": "amqp091", "dest_protocol": "amqp091",
            # RabbitMQ's counters: "pending" counts messages it holds back while the destination is
            # blocked; this shovel holds none (the socket's buffer pushes back on the source instead).
            "forwarded": self.forwarded, "pending": 0,
            "remaining": self.remaining if self.remaining is not None else "unlimited",
            "remaining_unacked": len(self._outstanding) if self.remaining is not None else "unlimited",
            "blocked_status": "running",
        }
        if d.src_queue is not None:
            info["src_queue"] = d.src_queue
        else:
            info["src_exchange"], info["src_exchange_key"] = d.src_exchange, d.src_exchange_key
        if d.dest_queue:
            info["dest_queue"] = d.dest_queue
        elif d.dest_exchange is not None:
            info["dest_exchange"] = d.dest_exchange
            if d.dest_exchange_key is not None:
                info["dest_exchange_key"] = d.dest_exchange_key
        if self.state == "terminated":
            info["reason"] = self.reason or ""
        return info


class _NotFound(Exception):
    """A passive declare found nothing (the channel is open again)."""


def _entry(name: str, value: Any) -> bytes:
    """One encoded table entry: the table encoding of {name: value} without its length prefix."""
    return encode_table({name: value})[4:]
