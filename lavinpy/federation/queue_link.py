"""One queue federation link: a federated queue of this node fed from the queue of that name upstream.

As RabbitMQ's queue federation, the link moves messages only while the local queue has consumers and no
ready messages of its own: it then consumes the upstream queue (``prefetch-count``, ``ack-mode``) and
publishes each message to the local queue through the default exchange, and goes on while fewer than
``prefetch-count`` messages are ready here; otherwise it cancels its upstream consumer, so the messages
wait upstream for that site's own consumers. As RabbitMQ's link, it consumes upstream with consumer
priority -1 (``x-priority``): the upstream's own consumers, at the default 0, get every message they
have credit for first. A message moves once per hop: it is acknowledged upstream once this node has it
(on-confirm, on-publish) or at once (no-ack), and carries an ``x-received-from`` entry (uri, queue,
redelivered, visit-count: how often it came this way) with, on its first hop, its original exchange and
routing key (``x-original-exchange``, ``x-original-routing-key``) and any CC header renamed
``x-original-cc``. The local queue's state is looked at every 0.1 s, every 0.02 s while messages
move (the server gives it), not pushed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pamqp import commands as spec

from lavinpy.wire.field_table import Int64, encode_table
from lavinpy.wire.properties import append_header_entry, peek_headers, replace_headers
from lavinpy.wire.uri import AMQPURL, shown_uri

from .client import LinkConnection, LinkError, connect, unchecked
from .link import RECEIVED_FROM, STOP_SECONDS, LinkRunner, Settlement, _now
from .upstream import Upstream

log = logging.getLogger("lavinpy.federation")

CHECK_SECONDS = 0.1  # how often the local queue is looked at
BUSY_CHECK_SECONDS = 0.02  # ... while messages move: whether to stop or go on matters at once then
LINK_PRIORITY = Int64(-1)  # below the upstream's own consumers (RabbitMQ's link: a long -1)
# Names whose bytes anywhere in a property block send a message through the full header rewrite: without
# them the message makes its first hop and only gains entries, appended to its headers as encoded.
REWRITTEN = (RECEIVED_FROM.encode(), b"x-original-", b"CC")
FIRST_HOP_CACHE = 1024  # encoded first-hop entries kept, by (redelivered, exchange, routing key)


@dataclass
class QueueEnv:
    local_url: Callable[[str], AMQPURL]
    queue: Callable[[], tuple[int, int] | None]  # (consumers, ready messages) of the local queue; None: gone
    refusal: Callable[[], str | None]


class QueueLink(LinkRunner):
    def __init__(self, vhost: str, queue: str, upstream: Upstream, env: QueueEnv) -> None:
        self.vhost, self.queue, self.upstream, self.env = vhost, queue, upstream, env
        self.described = f"federation link of queue {queue} in vhost {vhost}"
        self.upstream_queue = upstream.queue or queue
        self.state = "starting"
        self.error: str | None = None
        self.timestamp = _now()
        self.uri: str | None = None
        self.task: asyncio.Task[None] | None = None
        self.received = self.forwarded = 0
        self.consuming = False
        self._up: LinkConnection | None = None
        self._down: LinkConnection | None = None
        self._settlement = Settlement()
        self._tag = ""
        self._first_hop: dict[tuple[bool, str, str], bytes] = {}

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(
            self.run(), name=f"federation queue {self.vhost}/{self.queue} <- {self.upstream.name}")

    async def stop(self, cleanup: bool = False) -> None:
        task = self.task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=STOP_SECONDS)
        for client in (self._up, self._down):
            if client is not None:
                try:
                    await client.close(1.0)
                except Exception:
                    client.abort()
        self._up = self._down = None

    async def _session(self) -> None:
        if self.env.queue() is None:
            raise LinkError(f"no queue '{self.queue}' in vhost '{self.vhost}'")
        self._settlement.clear()
        self._first_hop.clear()  # they name the upstream's URI, which may change
        self.consuming = False
        errors = []
        for uri in self.upstream.uris:
            try:
                self._up = await connect(self._url(uri), f"Federation link (upstream: {self.upstream.name}, "
                                                         f"queue: {self.queue})")
                self.uri = uri
                break
            except LinkError as e:
                errors.append(str(e))
        if self._up is None:
            raise LinkError("; ".join(errors))
        up = self._up
        capabilities = up.server_properties.get("capabilities")
        if not (isinstance(capabilities, dict) and capabilities.get("consumer_priorities") is True):
            raise LinkError("the upstream lacks consumer priorities (its local consumers would not come first)")
        down = self._down = await connect(self.env.local_url(f"amqp:///{self.vhost}"),
                                          f"Federation link (downstream: {self.queue})")
        await up.rpc(unchecked(spec.Queue.Declare, queue=self.upstream_queue, durable=True), spec.Queue.DeclareOk)
        no_ack = self.upstream.ack_mode == "no-ack"
        if not no_ack:
            await up.rpc(spec.Basic.Qos(prefetch_count=self.upstream.prefetch_count), spec.Basic.QosOk)
        if self.upstream.ack_mode == "on-confirm":
            await down.rpc(spec.Confirm.Select(), spec.Confirm.SelectOk)
            down.on_confirm = self._confirmed
        down.on_writable = lambda writable: up.pause_reading(not writable)
        up.publish_through(down)
        up.on_message = self._deliver
        self._set_state("running")
        log.info("federation link of queue %s in vhost %s running from upstream %s (%s)", self.queue, self.vhost,
                 self.upstream.name, shown_uri(self.uri or "", None))
        seen = -1  # messages received at the last look: more since, and the next look comes sooner
        while not (up.closed.done() or down.closed.done()):
            busy, seen = self.received != seen, self.received
            await asyncio.wait([asyncio.shield(up.closed), asyncio.shield(down.closed)],
                               timeout=BUSY_CHECK_SECONDS if busy else CHECK_SECONDS)
            if up.closed.done() or down.closed.done():
                break
            local = self.env.queue()
            if local is None:
                raise LinkError(f"no queue '{self.queue}' in vhost '{self.vhost}'")
            consumers, ready = local
            # Start when the local consumers have nothing ready; once moving, go on while what is ready
            # here stays below one prefetch (what the link itself just brought, not yet taken), so a link
            # faster than the consumers does not stop and start at every check.
            want = consumers > 0 and (ready == 0 or (self.consuming and ready < self.upstream.prefetch_count))
            if want and not self.consuming:
                ok = await up.rpc(unchecked(spec.Basic.Consume, queue=self.upstream_queue,
                                            consumer_tag=self.upstream.consumer_tag or "", no_ack=no_ack,
                                            arguments={"x-priority": LINK_PRIORITY}),
                                  spec.Basic.ConsumeOk)
                self._tag, self.consuming = ok.consumer_tag, True
            elif not want and self.consuming:
                await up.rpc(spec.Basic.Cancel(consumer_tag=self._tag), spec.Basic.CancelOk)
                self.consuming = False
        failed, side = (up, "upstream") if up.closed.done() else (down, "downstream")
        raise LinkError(f"{side}: {failed.error}")

    def _deliver(self, tag: int, redelivered: bool, exchange: str, routing_key: str, properties: bytes,
                 body: bytes) -> None:
        up, down = self._up, self._down
        if up is None or down is None:
            return
        self.received += 1
        if any(name in properties for name in REWRITTEN):
            properties = replace_headers(properties, self._headers(
                peek_headers(properties) or {}, redelivered, exchange, routing_key))
        else:  # the same headers as the rewrite's, without decoding and encoding those already there
            key = (redelivered, exchange, routing_key)
            entries = self._first_hop.get(key)
            if entries is None:
                if len(self._first_hop) >= FIRST_HOP_CACHE:
                    self._first_hop.clear()
                entries = self._first_hop[key] = encode_table(self._headers({}, redelivered, exchange, routing_key))[4:]
            properties = append_header_entry(properties, entries)
        down.publish("", self.queue, properties, body)
        self.forwarded += 1
        if self.upstream.ack_mode == "on-confirm":
            self._settlement.published(tag)
        elif self.upstream.ack_mode == "on-publish":
            up.ack(tag, False)

    def _headers(self, headers: dict[str, Any], redelivered: bool, exchange: str, routing_key: str) -> dict[str, Any]:
        """RabbitMQ's queue link's headers: this hop's entry first, with how often the message came this way."""
        here = {"uri": self._safe_uri(), "queue": self.upstream_queue}
        trail = headers.get(RECEIVED_FROM)
        visits = 0
        if isinstance(trail, list):
            same = [e for e in trail if isinstance(e, dict) and all(e.get(k) == v for k, v in here.items())]
            trail = [e for e in trail if not any(e is s for s in same)]
            count = same[0].get("visit-count") if same else 0
            visits = count if isinstance(count, int) else 0
        else:
            trail = []
            headers["x-original-exchange"], headers["x-original-routing-key"] = exchange, routing_key
        if "CC" in headers:
            headers["x-original-cc"] = headers.pop("CC")
        headers[RECEIVED_FROM] = [{**here, "redelivered": redelivered, "visit-count": Int64(visits + 1)}, *trail]
        return headers


    def status(self, node: str, link_id: str) -> dict[str, Any]:
        info: dict[str, Any] = {
            "node": node, "queue": self.queue, "upstream_queue": self.upstream_queue, "type": "queue",
            "vhost": self.vhost, "upstream": self.upstream.name, "id": link_id, "status": self.state,
            "timestamp": self.timestamp, "uri": shown_uri(self.uri or self.upstream.uris[0], None),
            "local_connection": f"Federation link (downstream: {self.queue})",
            "messages_received": self.received, "messages_forwarded": self.forwarded, "consuming": self.consuming,
        }
        if self.state == "error":
            info["error"] = self.error or ""
            info["failures"] = self.failures
        return info
