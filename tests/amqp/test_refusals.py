"""The model's refusals (broker.errors) as each face answers them: every kind has an AMQP reply code
whose name is the kind's (so the close carries RabbitMQ's text unchanged), an HTTP status, and an
MQTT CONNACK code; a channel-level refusal closes the channel, a connection-level one the connection."""

from __future__ import annotations

from lavinpy.amqp.refusals import CHANNEL_ERRORS, CONNECTION_ERRORS, REPLY_CODES, reply_code
from lavinpy.broker.errors import (
    NOT_FOUND,
    PRECONDITION_FAILED,
    BrokerChannelError,
    BrokerConnectionError,
    ErrorKind,
)
from lavinpy.http.errors import KIND_TO_HTTP
from lavinpy.mqtt import codec
from lavinpy.mqtt.connection import CONNACK_CODES
from lavinpy.wire.constants import REPLY_NAMES
from lavinpy.wire.errors import AMQPChannelError


def test_every_kind_has_a_reply_code_of_its_name_and_the_same_text():
    assert set(REPLY_CODES) == set(ErrorKind)
    for kind, code in REPLY_CODES.items():
        assert REPLY_NAMES[code] == kind.value
        refusal = BrokerChannelError(kind, "no queue 'q' in vhost '/'", 50, 10)
        as_amqp = AMQPChannelError(code, "no queue 'q' in vhost '/'", 50, 10)
        assert (reply_code(refusal), refusal.text) == (as_amqp.reply_code, as_amqp.text)


def test_texts_are_cut_as_amqp_cuts_them():
    long = "é" * 200
    assert BrokerChannelError(NOT_FOUND, long).text == AMQPChannelError(404, long).text


def test_the_level_decides_what_closes():
    assert isinstance(BrokerChannelError(NOT_FOUND, "x"), CHANNEL_ERRORS)
    assert not isinstance(BrokerChannelError(NOT_FOUND, "x"), CONNECTION_ERRORS)
    assert isinstance(BrokerConnectionError(NOT_FOUND, "x"), CONNECTION_ERRORS)
    assert not isinstance(BrokerConnectionError(NOT_FOUND, "x"), CHANNEL_ERRORS)


def test_http_and_mqtt_tables():
    assert KIND_TO_HTTP[ErrorKind.ACCESS_REFUSED] == (401, "not_authorised")
    assert KIND_TO_HTTP[ErrorKind.NOT_FOUND] == (404, "Object Not Found")
    assert KIND_TO_HTTP[PRECONDITION_FAILED] == (400, "bad_request")
    assert set(CONNACK_CODES) == set(ErrorKind)
    assert set(CONNACK_CODES.values()) == {codec.NOT_AUTHORIZED}
