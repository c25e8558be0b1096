"""Names as RabbitMQ takes them: any UTF-8 name of up to 255 bytes (spaces, punctuation, non-ASCII)
for a durable queue and exchange is stored in the definitions log, comes back after a restart, and
goes through a definitions export and import; the binding between them too."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lavinpy.broker.ops import objects
from lavinpy.broker.ops.definitions.documents import export_definitions, import_definitions
from tests.broker.model_harness import OWNER, Model

# Any code point that UTF-8 can hold (surrogates cannot be encoded), up to RabbitMQ's 255 bytes;
# names under amq. are reserved for the broker's own objects.
NAMES = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=255).filter(
    lambda n: len(n.encode()) <= 255 and not n.startswith("amq."))
KNOWN = ["ünï", "federation: x -> rabbit@h", "a b\tc", "日本語キュー", "é" * 127, "x" * 255, "q/with/slashes",
         "🐇 rabbit", "trailing ", "\x00nul"]


def _populate(model: Model, queue: str, exchange: str) -> None:
    objects.declare_exchange(None, model.vhost, exchange, "topic", durable=True)
    objects.declare_queue(None, model.vhost, queue, owner=OWNER, durable=True)
    objects.bind_queue(None, model.vhost, queue, exchange, queue, None, owner=OWNER)
    assert model.publish(queue, b"kept", exchange=exchange, delivery_mode=2)


def _check(model: Model, queue: str, exchange: str, messages: int) -> None:
    vhost = model.vhost
    assert vhost.get_exchange(exchange).durable
    assert vhost.get_queue(queue).durable
    assert vhost.get_queue(queue).message_count == messages
    bindings = [b for b in export_definitions(model.broker, None)["bindings"] if b["source"] == exchange]
    assert [(b["destination"], b["routing_key"]) for b in bindings] == [(queue, queue)]


def _round_trip(queue: str, exchange: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model = Model(Path(tmp))
        try:
            _populate(model, queue, exchange)
            model.reopen()
            _check(model, queue, exchange, 1)
            doc = export_definitions(model.broker, None)
            assert queue in [q["name"] for q in doc["queues"]]
            assert exchange in [e["name"] for e in doc["exchanges"]]
            objects.delete_queue(None, model.vhost, queue, owner=OWNER)
            objects.delete_exchange(None, model.vhost, exchange)
            import_definitions(model.broker, None, doc)
            model.reopen()
            _check(model, queue, exchange, 0)
        finally:
            model.close()


def test_known_names_round_trip():
    for name in KNOWN:
        _round_trip(name, name)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(queue=NAMES, exchange=NAMES)
def test_any_name_round_trips(queue, exchange):
    _round_trip(queue, exchange)
