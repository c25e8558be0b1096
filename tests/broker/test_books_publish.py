"""Publishing as the model books it (broker.ops.publish): vhost, exchange and per-protocol counters,
once per message or once per run, whichever face publishes."""

from __future__ import annotations

from typing import Any

from lavinpy.broker.metrics.stats import MessageCounters, ProtocolCounters, ProtocolId
from lavinpy.broker.ops import publish as publish_ops

FACE = ProtocolId("face", "A Face")


class BookExchange:
    def __init__(self) -> None:
        self.name = "x"
        self.stats = MessageCounters()


class BookVhost:
    """Routes to ``queues`` queues (0: unroutable); a run is taken whole unless ``runs`` is False."""

    def __init__(self, queues: int, runs: bool = True) -> None:
        self.stats = MessageCounters()
        self.queues = queues
        self.runs = runs

    def publish(self, exchange: Any, routing_key: str, properties: bytes, body: bytes,
                stored: int = -1) -> tuple[int, bool]:
        return self.queues, bool(self.queues)

    def publish_run(self, exchange: Any, routing_key: str, properties: bytes,
                    bodies: list[bytes]) -> tuple[int, bool] | None:
        return (self.queues, True) if self.runs else None


def counts(vhost: BookVhost, exchange: BookExchange) -> tuple[int, ...]:
    return (vhost.stats.publish, exchange.stats.publish_in, exchange.stats.publish_out,
            vhost.stats.return_unroutable, vhost.stats.drop_unroutable)


def by_protocol(counters: ProtocolCounters) -> tuple[int, ...]:
    return (counters.publish, counters.publish_out, counters.return_unroutable, counters.drop_unroutable,
            counters.received_confirm, counters.confirm)


def test_routed_returned_and_dropped_publishes_are_counted_once():
    exchange = BookExchange()
    face = ProtocolCounters(FACE)
    routed = BookVhost(2)
    assert publish_ops.publish(routed, exchange, "k", True, b"\0\0", b"m", face) == (True, True)  # type: ignore[arg-type]
    assert counts(routed, exchange) == (1, 1, 1, 0, 0)
    nowhere = BookVhost(0)
    returned = publish_ops.publish(nowhere, exchange, "k", True, b"\0\0", b"m", face, 1)  # type: ignore[arg-type]
    dropped = publish_ops.publish(nowhere, exchange, "k", False, b"\0\0", b"m", face)  # type: ignore[arg-type]
    assert returned == dropped == (False, False)
    assert counts(nowhere, exchange) == (2, 3, 1, 1, 1)
    publish_ops.unroutable_reply(nowhere, exchange, False, face)  # type: ignore[arg-type]
    assert counts(nowhere, exchange) == (3, 4, 1, 1, 2)
    # the protocol's figures are the sum of what it published, counted where the vhost's are
    assert by_protocol(face) == (4, 1, 1, 2, 1, 0)


def test_a_run_is_counted_once_or_not_at_all_when_declined():
    exchange = BookExchange()
    face = ProtocolCounters(FACE)
    vhost = BookVhost(1)
    bodies = [b"a", b"b", b"c"]
    assert publish_ops.publish_run(vhost, exchange, "k", b"\0\0", bodies, face, True) is True  # type: ignore[arg-type]
    assert counts(vhost, exchange) == (3, 3, 3, 0, 0)
    declined = BookVhost(1, runs=False)
    assert publish_ops.publish_run(declined, exchange, "k", b"\0\0", [b"a"], face) is None  # type: ignore[arg-type]
    assert declined.stats.publish == 0
    publish_ops.confirmed(vhost, 3, face)  # type: ignore[arg-type]
    assert vhost.stats.confirm == 3
    assert by_protocol(face) == (3, 3, 0, 0, 3, 3)
