"""Route a message that leaves a queue dead (rejected, expired, maxlen, delivery_limit) to its DLX.

The copy gets RabbitMQ's ``x-death`` history (see ``death_headers``), is stored once with a fresh
timestamp (TTLs of the dead-letter queue count from now), and is pushed to every queue the DLX
routes it to, except queues that would close a fully automatic cycle. Dead-lettering is
at-most-once, as in RabbitMQ: a missing DLX, no route, or a full reject-publish target drops it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from ..store.record import StoredMessage
from ..wire.properties import PropertiesError, peek_headers
from .publishing import append_and_push
from .queues.death_headers import dead_letter_properties, death_routing_keys, should_drop_cycle
from .queues.ttl import now_ms

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..store.vhost_store import VhostStore
    from .exchanges.base import Exchange
    from .queues.base import QueueKind

log = logging.getLogger("lavinpy.dead_lettering")


class DeadLetterHost(Protocol):
    """What dead-lettering needs of the vhost: its exchanges, its routing and its store."""

    @property
    def name(self) -> str: ...

    @property
    def exchanges(self) -> Mapping[str, Exchange]: ...

    @property
    def store(self) -> VhostStore: ...

    def route(self, exchange: Exchange, routing_key: str, headers: dict | None,
              properties: bytes | None = None) -> set: ...


def dead_letter(vhost: DeadLetterHost, queue: QueueKind, msg: StoredMessage, reason: str) -> int:
    """Dead-letter ``msg`` leaving ``queue`` for ``reason``; returns how many queues got the copy.

    The caller removes the original from its queue (ack) whatever this returns.
    """
    settings = queue.settings
    dlx_name = settings.dead_letter_exchange
    if dlx_name is None:
        return 0
    exchange = vhost.exchanges.get(dlx_name)
    if exchange is None:
        return 0
    dlrk = settings.dead_letter_routing_key
    now = now_ms()
    try:
        keys = death_routing_keys(msg.routing_key, msg.properties)
        properties = dead_letter_properties(msg.properties, queue=queue.name, reason=reason, exchange=msg.exchange,
                                            routing_keys=keys, now_ms=now, drop_cc=dlrk is not None)
        headers = peek_headers(properties)
    except PropertiesError as err:
        log.warning("queue %r in vhost %r: cannot dead-letter a message with malformed properties (%s); "
                    "dropped", queue.name, vhost.name, err)
        return 0
    routing_key = msg.routing_key if dlrk is None else dlrk
    size = len(msg.body)
    targets = []
    for target in vhost.route(exchange, routing_key, headers, properties):
        if should_drop_cycle(properties, target.name):
            continue
        if target.refuses(size):
            continue  # a full reject-publish dead-letter queue drops it
        targets.append(target)
    if not targets:
        return 0
    queue.stats.add_dead_lettered(reason)
    return append_and_push(vhost.store, dlx_name, routing_key, properties, msg.body, now, targets)[0]
