"""Queue/consumer/message argument validation (RabbitMQ's texts) and argument/policy precedence."""

from __future__ import annotations

import datetime

import pytest

from lavinpy.broker.errors import BrokerChannelError
from lavinpy.broker.queues.stream_arguments import (
    parse_stream_offset,
    validate_stream_consumer,
    validate_stream_declare,
)
from lavinpy.broker.settings.arguments import (
    ArgumentError,
    QueueSettings,
    alternate_exchange,
    parse_expiration,
    parse_max_age,
    validate_consumer_arguments,
    validate_queue_arguments,
)


def error_of(arguments: dict, **kw) -> ArgumentError:
    with pytest.raises(ArgumentError) as info:
        validate_queue_arguments(arguments, queue="q", vhost="/", **kw)
    return info.value


@pytest.mark.parametrize("arguments, name, reason", [
    ({"x-max-length": -1}, "x-max-length", "{value_negative,-1}"),
    ({"x-max-length": "10"}, "x-max-length", "{unacceptable_type,longstr}"),
    ({"x-max-length-bytes": 1.5}, "x-max-length-bytes", "{unacceptable_type,double}"),
    ({"x-message-ttl": -5}, "x-message-ttl", "{value_negative,-5}"),
    ({"x-message-ttl": 315_360_000_001}, "x-message-ttl", "{value_too_large,315360000001}"),
    ({"x-message-ttl": True}, "x-message-ttl", "{unacceptable_type,bool}"),
    ({"x-expires": 0}, "x-expires", "{value_zero,0}"),
    ({"x-expires": -1}, "x-expires", "{value_negative,-1}"),
    ({"x-max-priority": 256}, "x-max-priority", "{max_value_exceeded,256}"),
    ({"x-max-priority": -1}, "x-max-priority", "{value_negative,-1}"),
    ({"x-overflow": "drop-tail"}, "x-overflow", "invalid_overflow"),
    ({"x-overflow": 1}, "x-overflow", "{unacceptable_type,long}"),
    ({"x-dead-letter-exchange": 5}, "x-dead-letter-exchange", "{unacceptable_type,long}"),
    ({"x-dead-letter-routing-key": "rk"}, "x-dead-letter-routing-key", "routing_key_but_no_dlx_defined"),
    ({"x-single-active-consumer": 1}, "x-single-active-consumer", "{unacceptable_type,long}"),
    ({"x-delivery-limit": -2}, "x-delivery-limit", "{value_negative,-2}"),
    ({"x-consumer-timeout": -1}, "x-consumer-timeout", "{value_negative,-1}"),
    ({"x-queue-mode": "fast"}, "x-queue-mode", "invalid_queue_mode"),
    ({"x-max-age": "7W"}, "x-max-age", "invalid_max_age"),
    ({"x-max-age": 7}, "x-max-age", "{unacceptable_type,long}"),
    ({"x-stream-max-segment-size-bytes": -1}, "x-stream-max-segment-size-bytes", "{value_negative,-1}"),
])
def test_bad_declare_arguments_name_the_argument(arguments: dict, name: str, reason: str) -> None:
    err = error_of(arguments)
    assert err.name == name
    assert err.text == f"invalid arg '{name}' for queue 'q' in vhost '/': {reason}"


def test_good_declare_arguments_pass() -> None:
    validate_queue_arguments({
        "x-message-ttl": 0, "x-expires": 1, "x-max-length": 0, "x-max-length-bytes": 10,
        "x-overflow": "reject-publish-dlx", "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "k",
        "x-delivery-limit": -1, "x-max-priority": 0, "x-single-active-consumer": False,
        "x-consumer-timeout": 0, "x-queue-mode": "lazy", "x-unknown-thing": object(),
    }, queue="q", vhost="/")
    # Celery's delayed-delivery queues ask for TTLs up to 2^27 s: RabbitMQ 3.11+ allows ten years
    validate_queue_arguments({"x-max-priority": 255, "x-message-ttl": 315_360_000_000, "x-expires": 2**27 * 1000},
                             queue="q", vhost="/")


def test_queue_type_must_be_supported() -> None:
    err = error_of({"x-queue-type": "bogus"})
    assert err.name == "x-queue-type"
    assert err.text == "invalid arg 'x-queue-type' for queue 'q' in vhost '/': queue type 'bogus' is not supported"
    validate_queue_arguments({"x-queue-type": "bogus"}, queue="q", vhost="/",
                             queue_types=("classic", "bogus"))


@pytest.mark.parametrize("flags, prop", [
    ({"durable": False}, "non-durable"),
    ({"exclusive": True}, "exclusive-owner"),
    ({"auto_delete": True}, "auto-delete"),
])
def test_stream_needs_a_durable_shared_queue(flags: dict, prop: str) -> None:
    declare = {"durable": True, "exclusive": False, "auto_delete": False, **flags}
    with pytest.raises(BrokerChannelError) as info:
        validate_stream_declare("q", "/", arguments={"x-queue-type": "stream"}, **declare)
    assert info.value.text == f"PRECONDITION_FAILED - invalid property '{prop}' for queue 'q' in vhost '/'"


def test_stream_refuses_queue_only_arguments() -> None:
    with pytest.raises(BrokerChannelError) as info:
        validate_stream_declare("q", "/", durable=True, exclusive=False, auto_delete=False,
                                arguments={"x-queue-type": "stream", "x-message-ttl": 1000})
    assert info.value.text.endswith("invalid arg 'x-message-ttl' for queue 'q' in vhost '/' of queue type stream")
    validate_stream_declare("q", "/", durable=True, exclusive=False, auto_delete=False,
                            arguments={"x-queue-type": "stream", "x-max-age": "7D", "x-max-length-bytes": 10**9,
                                       "x-stream-max-segment-size-bytes": 10**6})


@pytest.mark.parametrize("text, ms", [
    ("7D", 7 * 86_400_000), ("12h", 43_200_000), ("30m", 1_800_000), ("10s", 10_000), ("1Y", 365 * 86_400_000),
    ("1M", 30 * 86_400_000), (b"1h", 3_600_000)])
def test_parse_max_age(text: str, ms: int) -> None:
    assert parse_max_age(text) == ms


@pytest.mark.parametrize("text", ["0D", "7", "D", "7d", "-1h", "1.5h", "7D ", "", 7, None])
def test_parse_max_age_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_max_age(text)


def test_parse_expiration() -> None:
    assert parse_expiration("0") == 0
    assert parse_expiration("60000") == 60000
    for text, reason in (("abc", "no_integer"), ("10s", '{leftover_string,"s"}'),
                         ("-1", "{value_negative,-1}"), ("315360000001", "{value_too_large,315360000001}")):
        with pytest.raises(ArgumentError) as info:
            parse_expiration(text)
        assert info.value.name == "expiration"
        assert info.value.text == f"invalid expiration '{text}': {reason}"


def test_consumer_arguments() -> None:
    assert validate_consumer_arguments({"x-priority": -5}, queue="q", vhost="/") is None
    with pytest.raises(ArgumentError) as info:
        validate_consumer_arguments({"x-priority": "high"}, queue="q", vhost="/")
    assert info.value.text == "invalid arg 'x-priority' for queue 'q' in vhost '/': {unacceptable_type,longstr}"


@pytest.mark.parametrize("value, expected", [
    ("first", ("first", 0)), ("last", ("last", 0)), ("next", ("next", 0)),
    (0, ("offset", 0)), (42, ("offset", 42)),
    (datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC), ("timestamp", 1704067200000)),
    ("1h", ("timestamp", 10_000_000 - 3_600_000)),
])
def test_stream_offsets(value: object, expected: tuple[str, int]) -> None:
    assert parse_stream_offset(value, now_ms=10_000_000) == expected


@pytest.mark.parametrize("value", ["middle", "-1", 1.5, True])  # the number -1 is the last message
def test_bad_stream_offsets(value: object) -> None:
    with pytest.raises(BrokerChannelError) as info:
        validate_stream_consumer(False, 10, {"x-stream-offset": value}, queue="s", vhost="/")
    assert info.value.text.startswith("PRECONDITION_FAILED - invalid x-stream-offset for queue 's' in vhost '/': ")


def test_settings_from_arguments_only() -> None:
    s = QueueSettings.resolve({"x-message-ttl": 1000, "x-max-length": 5, "x-overflow": "reject-publish",
                               "x-dead-letter-exchange": "dlx", "x-max-priority": 10,
                               "x-single-active-consumer": True, "x-delivery-limit": 3})
    assert (s.message_ttl, s.max_length, s.overflow, s.dead_letter_exchange) == (1000, 5, "reject-publish", "dlx")
    assert (s.max_priority, s.single_active_consumer, s.delivery_limit) == (10, True, 3)
    assert s.expires is None and s.dead_letter_routing_key is None and s.queue_type == "classic"


def test_numeric_limits_take_the_smaller_of_argument_and_policy() -> None:
    args = {"x-message-ttl": 1000, "x-expires": 60000, "x-max-length": 10, "x-max-length-bytes": 100,
            "x-delivery-limit": 5, "x-consumer-timeout": 9000, "x-max-age": "2D"}
    policy = {"message-ttl": 5000, "expires": 1000, "max-length": 20, "max-length-bytes": 50,
              "delivery-limit": 2, "consumer-timeout": 10000, "max-age": "1D"}
    s = QueueSettings.resolve(args, policy, "p")
    assert (s.message_ttl, s.expires, s.max_length, s.max_length_bytes) == (1000, 1000, 10, 50)
    assert (s.delivery_limit, s.consumer_timeout, s.max_age, s.policy) == (2, 9000, 86_400_000, "p")


def test_policy_fills_what_arguments_leave_out() -> None:
    s = QueueSettings.resolve({}, {"message-ttl": 5000, "dead-letter-exchange": "dlx",
                                   "dead-letter-routing-key": "dead", "overflow": "reject-publish-dlx"})
    assert (s.message_ttl, s.dead_letter_exchange, s.dead_letter_routing_key, s.overflow) == (
        5000, "dlx", "dead", "reject-publish-dlx")


def test_arguments_win_for_non_numeric_keys() -> None:
    s = QueueSettings.resolve({"x-dead-letter-exchange": "", "x-overflow": "drop-head"},
                              {"dead-letter-exchange": "other", "overflow": "reject-publish",
                               "dead-letter-routing-key": "from-policy"})
    assert s.dead_letter_exchange == "" and s.overflow == "drop-head"
    assert s.dead_letter_routing_key == "from-policy"  # each key is resolved on its own, as in RabbitMQ


def test_policy_cannot_set_declare_time_features() -> None:
    s = QueueSettings.resolve({}, {"max-priority": 10, "single-active-consumer": True, "queue-type": "stream"})
    assert s.max_priority is None and not s.single_active_consumer and s.queue_type == "classic"


def test_delivery_limit_minus_one_means_unlimited() -> None:
    assert QueueSettings.resolve({"x-delivery-limit": -1}).delivery_limit is None
    assert QueueSettings.resolve({"x-delivery-limit": -1}, {"delivery-limit": 4}).delivery_limit is None
    assert not QueueSettings.resolve({"x-max-priority": 0}).max_priority  # one level: a plain queue


def test_alternate_exchange_argument_wins() -> None:
    assert alternate_exchange({"alternate-exchange": "ae"}, {"alternate-exchange": "pol"}) == "ae"
    assert alternate_exchange({}, {"alternate-exchange": "pol"}) == "pol"
    assert alternate_exchange({}, None) is None
