"""A URI's connection settings (RabbitMQ's URI query keys), parsed once for every client of ours."""

from __future__ import annotations

import pytest
from pamqp import commands, frame

from lavinpy.wire.client_connection import ClientConnection, ClientProtocolError
from lavinpy.wire.uri import QUERY_KEYS, Tuning, parse_url
from lavinpy.wire.writer import method_frame


def test_every_key_is_read_as_rabbitmqs_erlang_client_reads_it() -> None:
    url = parse_url("amqp://u:p@h/v?heartbeat=7&connection_timeout=2500&channel_max=9&frame_max=8192"
                    "&auth_mechanism=external&auth_mechanism=AMQPlain")
    assert url.tuning == Tuning(heartbeat=7, connection_timeout=2.5, channel_max=9, frame_max=8192,
                                mechanisms=("EXTERNAL", "AMQPLAIN"))
    assert url.mechanism == "EXTERNAL"  # the first given
    assert parse_url("amqp://h/v").tuning == Tuning() and parse_url("amqp://h/v").mechanism == "PLAIN"
    assert parse_url("amqp://h/v?heartbeat=0&frame_max=0").tuning == Tuning(heartbeat=0, frame_max=0)
    assert {"heartbeat", "connection_timeout", "channel_max", "frame_max", "auth_mechanism"} <= set(QUERY_KEYS)


@pytest.mark.parametrize(("query", "named"), [
    ("heartbeat=soon", "heartbeat='soon'"),
    ("heartbeat=-1", "heartbeat='-1'"),
    ("heartbeat=70000", "heartbeat='70000'"),
    ("connection_timeout=0", "connection_timeout='0'"),
    ("channel_max=65536", "channel_max='65536'"),
    ("frame_max=1000", "frame_max=1000"),
    ("auth_mechanism=lavinpy-internal", "auth_mechanism='lavinpy-internal'"),
    ("auth_mechanism=scram-sha-256", "auth_mechanism='scram-sha-256'"),
])
def test_a_bad_value_is_refused_naming_the_key(query: str, named: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse_url(f"amqps://h/v?{query}")
    assert str(refused.value).startswith(named)


def started(client: ClientConnection, mechanisms: str = "PLAIN") -> bytes:
    """The client after the broker's connection.start offering ``mechanisms``: what it answered."""
    client.initiate()
    client.data_to_send()
    client.receive_data(method_frame(0, commands.Connection.Start(server_properties={}, mechanisms=mechanisms,
                                                                   locales="en_US")))
    return client.data_to_send()


def tuned(client: ClientConnection, tune: commands.Connection.Tune) -> bytes:
    """The client's tune-ok (and connection.open) to the broker's ``tune``."""
    started(client)
    client.receive_data(method_frame(0, tune))
    return client.data_to_send()


def test_several_mechanisms_take_the_first_the_broker_offers() -> None:
    client = ClientConnection(mechanisms=("EXTERNAL", "AMQPLAIN", "PLAIN"))
    _, _, start_ok = frame.unmarshal(started(client, "PLAIN AMQPLAIN"))
    assert start_ok.mechanism == "AMQPLAIN" and client.mechanism == "AMQPLAIN"


def test_mechanisms_none_of_which_is_offered_are_a_clear_error() -> None:
    with pytest.raises(ClientProtocolError, match="does not offer SASL EXTERNAL or AMQPLAIN"):
        started(ClientConnection(mechanisms=("EXTERNAL", "AMQPLAIN")))


def test_a_uris_limits_are_what_the_tune_ok_asks() -> None:
    client = ClientConnection(heartbeat=5, channel_max=3, frame_max=8192)
    _, _, tune_ok = frame.unmarshal(tuned(client, commands.Connection.Tune(channel_max=2047, frame_max=131072,
                                                                           heartbeat=60)))
    assert (tune_ok.channel_max, tune_ok.frame_max, tune_ok.heartbeat) == (3, 8192, 5)
    unlimited = ClientConnection(frame_max=0)  # 0: the broker's largest
    tuned(unlimited, commands.Connection.Tune(channel_max=0, frame_max=262144, heartbeat=0))
    assert unlimited.frame_max == 262144 and unlimited.channel_max == 2047
