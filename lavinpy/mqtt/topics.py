"""MQTT topics and filters <-> AMQP topic-exchange routing and binding keys, as RabbitMQ maps them
(``/`` and ``.`` swap, ``+`` -> ``*``, ``#`` -> ``#``), their validation, and filter matching for
retained messages. Pure functions."""

from __future__ import annotations

_TO_AMQP = str.maketrans({"/": ".", ".": "/"})
_TO_AMQP_FILTER = str.maketrans({"/": ".", ".": "/", "+": "*"})
_FROM_AMQP_FILTER = str.maketrans({"/": ".", ".": "/", "*": "+"})


# The longest name of the model (an AMQP short string): routing and binding keys, queue names.
MAX_NAME_BYTES = 255


class TopicError(ValueError):
    """A topic name or filter the spec does not allow."""


def _check_length(what: str, name: str) -> None:
    if len(name) > MAX_NAME_BYTES // 4 and len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise TopicError(f"{what} over {MAX_NAME_BYTES} bytes (the longest routing key)")


def check_topic_name(topic: str) -> None:
    """A PUBLISH (or will) topic: not empty, no wildcards, a routing key of at most 255 bytes."""
    if not topic:
        raise TopicError("empty topic name")
    _check_length("topic name", topic)
    if "+" in topic or "#" in topic:
        raise TopicError(f"wildcard in topic name '{topic}'")


def check_filter(topic_filter: str) -> None:
    """A SUBSCRIBE filter: ``#`` only as the whole last level, ``+`` only as a whole level."""
    if not topic_filter:
        raise TopicError("empty topic filter")
    _check_length("topic filter", topic_filter)
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            raise TopicError(f"misplaced '#' in topic filter '{topic_filter}'")
        if "+" in level and level != "+":
            raise TopicError(f"misplaced '+' in topic filter '{topic_filter}'")


def routing_key(topic: str) -> str:
    """The AMQP routing key of an MQTT topic name."""
    return topic.translate(_TO_AMQP)


def binding_key(topic_filter: str) -> str:
    """The AMQP binding key of an MQTT topic filter."""
    return topic_filter.translate(_TO_AMQP_FILTER)


def topic_filter(key: str) -> str:
    """The MQTT topic filter of an AMQP binding key (what a subscription's binding shows)."""
    return key.translate(_FROM_AMQP_FILTER)


def topic_name(key: str) -> str:
    """The MQTT topic of a delivered message's AMQP routing key (the swap is its own inverse)."""
    return key.translate(_TO_AMQP)


def matches(topic_filter: str, topic: str) -> bool:
    """Whether an MQTT filter matches a topic name (topics starting with ``$`` match no leading wildcard)."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    filter_levels = topic_filter.split("/")
    topic_levels = topic.split("/")
    for i, level in enumerate(filter_levels):
        if level == "#":
            return True
        if i >= len(topic_levels):
            return False
        if level != "+" and level != topic_levels[i]:
            return False
    return len(filter_levels) == len(topic_levels)
