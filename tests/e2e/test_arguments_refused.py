"""Over TCP with pika: an argument lavinpy does not honour is refused with 406 naming it (docs/arguments.md),
and the channel's connection goes on; a bad value of a new consumer argument is refused naming it too."""

from __future__ import annotations

import pika.exceptions
import pytest

from . import uid
from .conftest import lavinpy_only

pytestmark = lavinpy_only("lavinpy's refusals of arguments it does not honour")


def test_refused_exchange_and_consumer_arguments_name_themselves(clients):
    conn, ch = clients.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        ch.exchange_declare(uid("flagged"), "direct", arguments={"x-delayed-exchange": True})
    assert refused.value.reply_code == 406
    assert "invalid arg 'x-delayed-exchange'" in refused.value.reply_text
    ch = conn.channel()
    stream = clients.track_queue(uid("stream"))
    ch.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
    ch.basic_qos(prefetch_count=10)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        ch.basic_consume(stream, lambda *a: None, arguments={"x-stream-automatic-offset-tracking": "yes"})
        conn.process_data_events(1)
    assert (refused.value.reply_code, refused.value.reply_text) == (
        406, "PRECONDITION_FAILED - x-stream-automatic-offset-tracking must be a boolean")
