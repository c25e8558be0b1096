"""Publishing as the model books it: a publish (one message or a run), an unroutable direct reply,
and confirms. Every face (an AMQP channel, the HTTP API, another protocol's session) publishes
through these, handing over its protocol's counters, so the vhost, exchange and per-protocol
counters are kept in one place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ...store.reserved_record import ReservedRecord
    from ..exchanges.base import Exchange
    from ..metrics.stats import ProtocolCounters
    from ..vhost import VHost


def publish(vhost: VHost, exchange: Exchange, routing_key: str, mandatory: bool, properties: bytes,
            body: bytes | memoryview, counters: ProtocolCounters, confirming: int = 0,
            stored: int = -1) -> tuple[bool, Any]:
    """Route and store one message, counted (``confirming``: 1 when its publisher expects a confirm
    and its protocol counts those here). Returns (routed: some queue took it, else a mandatory one
    goes back to its publisher; confirm: False, True when the confirm waits for an fsync, or
    ``publishing.REJECTED`` when a queue refused it and the confirm is a nack). ``stored``: the
    position of its record when its body was written in place (``reserve``)."""
    queued, confirm = vhost.publish(exchange, routing_key, properties, body, stored)  # type: ignore[arg-type]
    vhost_stats = vhost.stats
    vhost_stats.publish += 1
    counters.publish += 1
    if confirming:
        counters.received_confirm += confirming
    exchange_stats = exchange.stats
    exchange_stats.publish_in += 1
    if queued:
        exchange_stats.publish_out += 1
        counters.publish_out += 1
        return True, confirm
    if mandatory:
        vhost_stats.return_unroutable += 1
        counters.return_unroutable += 1
    else:
        vhost_stats.drop_unroutable += 1
        counters.drop_unroutable += 1
    return False, confirm


def reserve(vhost: VHost, exchange: Exchange, routing_key: str, properties: bytes, body_size: int) -> ReservedRecord:
    """A record in the vhost's message store for a large body written in place as its frames arrive:
    ``write`` each piece, ``seal`` for the position ``publish`` takes as ``stored``, then ``release``
    (``release`` alone when the body will not complete)."""
    return vhost.reserve(exchange, routing_key, properties, body_size)


def publish_run(vhost: VHost, exchange: Exchange, routing_key: str, properties: bytes | list[bytes],
                bodies: list[bytes], counters: ProtocolCounters, confirming: bool = False) -> bool | None:
    """A run of routable messages with the same exchange and routing key (``properties``: one block
    for all, or one per body), stored and counted once (``confirming``: each expects a confirm its
    protocol counts here); returns whether
    their confirms wait for an fsync. None: the run is not one the vhost takes whole (nothing was
    done; publish them one by one)."""
    published = vhost.publish_run(exchange, routing_key, properties, bodies)
    if published is None:
        return None
    run = len(bodies)
    vhost.stats.publish += run
    counters.publish += run
    counters.publish_out += run
    if confirming:
        counters.received_confirm += run
    exchange_stats = exchange.stats
    exchange_stats.publish_in += run
    exchange_stats.publish_out += run
    return published[1]


def unroutable_reply(vhost: VHost, exchange: Exchange, mandatory: bool, counters: ProtocolCounters) -> None:
    """A direct reply-to publish whose requester is gone: counted as an unroutable publish (a
    mandatory one goes back to its publisher)."""
    vhost_stats = vhost.stats
    vhost_stats.publish += 1
    counters.publish += 1
    exchange.stats.publish_in += 1
    if mandatory:
        vhost_stats.return_unroutable += 1
        counters.return_unroutable += 1
    else:
        vhost_stats.drop_unroutable += 1
        counters.drop_unroutable += 1


def confirmed(vhost: VHost, count: int, counters: ProtocolCounters) -> None:
    """``count`` publishes were confirmed to their publisher (basic.ack, PUBACK)."""
    vhost.stats.confirm += count
    counters.confirm += count
