"""A queue link's headers on each message it moves (in process, no broker): a message on its first hop
gains its entries appended to the headers it has, the same headers as the full rewrite gives; one that
came this way before (or has CC) goes through the full rewrite."""

from __future__ import annotations

from typing import Any

import pytest

from lavinpy.federation.queue_link import QueueEnv, QueueLink
from lavinpy.federation.upstream import parse_upstream
from lavinpy.wire.properties import decode_properties, encode_property_values, peek_headers, replace_headers
from lavinpy.wire.uri import AMQPURL


class _Sent:
    """Where the link publishes and acknowledges: what it sent, kept."""

    def __init__(self) -> None:
        self.published: list[tuple[str, str, bytes, bytes]] = []

    def publish(self, exchange: str, routing_key: str, properties: bytes, body: bytes) -> None:
        self.published.append((exchange, routing_key, properties, body))

    def ack(self, tag: int, multiple: bool) -> None:
        pass


def _link() -> tuple[QueueLink, _Sent]:
    upstream = parse_upstream("up", {"uri": "amqp://user:secret@upstream-host/%2F", "ack-mode": "on-publish"})
    link = QueueLink("/", "q", upstream, QueueEnv(local_url=lambda uri: AMQPURL(), queue=lambda: (1, 0),
                                                  refusal=lambda: None))
    sent = _Sent()
    link._up = link._down = sent  # type: ignore[assignment]
    link.uri = upstream.uris[0]
    return link, sent


def _rewritten(link: QueueLink, properties: bytes, redelivered: bool, exchange: str, key: str) -> dict[str, Any]:
    full = replace_headers(properties, link._headers(peek_headers(properties) or {}, redelivered, exchange, key))
    return peek_headers(full) or {}


CASES = [
    encode_property_values(delivery_mode=2),
    encode_property_values(delivery_mode=2, message_id="m-1", headers={"a": 1, "b": "two", "c": [1, "x"]}),
    encode_property_values(content_type="text/plain", headers={}),
    encode_property_values(headers={"CC": ["other"], "k": "v"}),
    encode_property_values(headers={"x-received-from": [{"uri": "amqp://upstream-host/%2F", "queue": "q",
                                                         "redelivered": False, "visit-count": 1}]}),
    encode_property_values(headers={"x-original-exchange": "was-here"}),
]


@pytest.mark.parametrize("properties", CASES)
@pytest.mark.parametrize("redelivered", [False, True])
def test_headers_as_the_full_rewrite_gives(properties: bytes, redelivered: bool) -> None:
    link, sent = _link()
    for n in range(3):  # the first hop's entries encoded once, then reused
        link._deliver(n + 1, redelivered, "x", "rk", properties, b"body")
    assert len(sent.published) == 3
    expected = _rewritten(link, properties, redelivered, "x", "rk")
    for exchange, routing_key, moved, body in sent.published:
        assert (exchange, routing_key, body) == ("", "q", b"body")
        headers = peek_headers(moved) or {}
        assert headers == expected
        assert list(headers) == list(expected)  # in the same order too
        before, after = decode_properties(properties), decode_properties(moved)
        assert (after.delivery_mode, after.message_id, after.content_type) == (
            before.delivery_mode, before.message_id, before.content_type)
    assert expected["x-received-from"][0]["uri"] == "amqp://user@upstream-host/%2F"  # no password


def test_first_hops_of_other_routes_get_their_own_entries() -> None:
    link, sent = _link()
    plain = encode_property_values(delivery_mode=2)
    link._deliver(1, False, "x", "a", plain, b"1")
    link._deliver(2, True, "y", "b", plain, b"2")
    first, second = (peek_headers(p) or {} for _, _, p, _ in sent.published)
    assert (first["x-original-exchange"], first["x-original-routing-key"]) == ("x", "a")
    assert (second["x-original-exchange"], second["x-original-routing-key"]) == ("y", "b")
    assert (first["x-received-from"][0]["redelivered"], second["x-received-from"][0]["redelivered"]) == (False, True)
