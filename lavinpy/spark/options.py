"""The data source's options (all strings, case-insensitive keys) parsed into checked values.

Parsing happens on the driver when the reader/writer is created, so a bad option fails the job
at once with a message naming the option, instead of failing every task.
"""

from __future__ import annotations

import datetime as _dt
import difflib
from collections.abc import Mapping
from dataclasses import dataclass

from .client import AMQPParams

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"

# A stream consumer's acks are credit, sent every half prefetch: each costs the reading task a send
# and the broker a wake-up, and a small credit makes the broker pause for them. A Spark task takes a
# batch (8,192 rows), then hands it to Spark: with a credit of one batch, the broker had stopped by
# the time the task came back for the next one, which it then waited for (0.1 µs a row, measured);
# with two, 0.01-0.02. Four cost RabbitMQ a third more CPU a message (it reads further ahead). The
# sockets' buffers, not the credit, bound what is in flight, whatever the messages' size.
STREAM_PREFETCH = 16384
# A queue consumer's prefetch is what it holds unacked, taken from the queue's other consumers.
QUEUE_PREFETCH = 2000


class OptionError(ValueError):
    """An option of the lavinpy data source has a bad value."""


# Every option of the source, read or write (docs/spark.md's table).
OPTIONS = ("url", "timeout", "queue", "exchange", "routingKey", "routingKeyColumn", "confirm", "persistent",
           "mandatory", "maxInFlight", "startingOffset", "endingOffset", "maxMessagesPerTrigger",
           "maxMessagesPerPartition", "prefetch", "consumers", "queueType", "idleTimeout")
# Names other Spark sources use for the same thing (Kafka's), which a pipeline moved over may still carry.
_OTHER_SOURCES = {"maxoffsetspertrigger": "maxMessagesPerTrigger", "startingoffsets": "startingOffset",
                  "endingoffsets": "endingOffset"}


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    _refuse_near_misses(options)
    return {str(k).lower(): str(v) for k, v in options.items() if v is not None}


def _refuse_near_misses(options: Mapping[str, str]) -> None:
    """An option that is not ours but close to one of ours (a typo, or another source's name) is refused
    naming ours: ignored, it would leave the default in force without a word. Options far from all of
    ours pass: Spark itself hands a source some (path, checkpointLocation)."""
    ours = {name.lower(): name for name in OPTIONS}
    for given in options:
        key = str(given).lower()
        if key in ours:
            continue
        meant = _OTHER_SOURCES.get(key) or next(
            (ours[close] for close in difflib.get_close_matches(key, list(ours), n=1, cutoff=0.8)), None)
        if meant is not None:
            raise OptionError(f"option {given!r} is not an option of the lavinpy source: did you mean {meant}?")


def _bool(opts: dict[str, str], key: str, default: bool) -> bool:
    raw = opts.get(key.lower())
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise OptionError(f"option {key}={raw!r}: expected true or false")


def _int(opts: dict[str, str], key: str, default: int | None, minimum: int = 1) -> int | None:
    raw = opts.get(key.lower())
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise OptionError(f"option {key}={raw!r}: expected an integer") from None
    if value < minimum:
        raise OptionError(f"option {key}={raw!r}: must be >= {minimum}")
    return value


def _float(opts: dict[str, str], key: str, default: float) -> float:
    raw = opts.get(key.lower())
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        raise OptionError(f"option {key}={raw!r}: expected a number of seconds") from None
    if value <= 0:
        raise OptionError(f"option {key}={raw!r}: must be > 0")
    return value


def _params(opts: dict[str, str]) -> AMQPParams:
    url = opts.get("url") or DEFAULT_URL
    try:
        return AMQPParams.from_url(url, timeout=_float(opts, "timeout", 30.0))
    except ValueError as exc:
        raise OptionError(f"option url: {exc}") from None


@dataclass(frozen=True)
class WriteOptions:
    params: AMQPParams
    exchange: str
    routing_key: str
    routing_key_column: str | None
    confirm: bool
    persistent: bool
    mandatory: bool
    max_in_flight: int

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> WriteOptions:
        opts = _lower(options)
        exchange = opts.get("exchange", "")
        queue = opts.get("queue", "")
        routing_key = opts.get("routingkey")
        if routing_key is None:
            # With the default exchange, `queue` is the natural target: its name is the routing key.
            routing_key = queue if exchange == "" else ""
        column = opts.get("routingkeycolumn") or None
        if exchange == "" and not routing_key and column is None:
            raise OptionError("set `exchange` (and `routingKey` or `routingKeyColumn`), or `queue` to publish "
                              "through the default exchange straight into that queue")
        return cls(params=_params(opts), exchange=exchange, routing_key=routing_key, routing_key_column=column,
                   confirm=_bool(opts, "confirm", True), persistent=_bool(opts, "persistent", True),
                   mandatory=_bool(opts, "mandatory", True),
                   max_in_flight=_int(opts, "maxInFlight", 20000) or 20000)


# Start positions. An int is an offset; these strings are the named positions.
FIRST = "first"   # the oldest message still in the stream
LAST = "last"     # the newest message now in the stream (inclusive)
NEXT = "next"     # only messages published from now on
LATEST = "latest"  # for endingOffset: the end of the stream when the query is planned

_START_NAMES = {"first": FIRST, "earliest": FIRST, "last": LAST, "next": NEXT, "latest": NEXT}

StartSpec = int | str | _dt.datetime


def parse_start(raw: str | None) -> StartSpec:
    """startingOffset: first|earliest (default), last, next|latest, an offset, or an ISO-8601 time."""
    if raw is None or raw.strip() == "":
        return FIRST
    value = raw.strip()
    named = _START_NAMES.get(value.lower())
    if named is not None:
        return named
    try:
        offset = int(value)
    except ValueError:
        pass
    else:
        if offset < 0:
            raise OptionError(f"option startingOffset={raw!r}: offsets are >= 0")
        return offset
    try:
        when = _dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise OptionError(f"option startingOffset={raw!r}: expected first, last, next, an offset or an "
                          f"ISO-8601 time such as 2024-05-01T12:00:00Z") from None
    return when if when.tzinfo else when.replace(tzinfo=_dt.UTC)


def parse_end(raw: str | None) -> int | str:
    """endingOffset (batch reads): latest (default) or an offset, exclusive."""
    if raw is None or raw.strip() == "" or raw.strip().lower() in ("latest", "last"):
        return LATEST
    try:
        value = int(raw.strip())
    except ValueError:
        raise OptionError(f"option endingOffset={raw!r}: expected latest or an offset (exclusive)") from None
    if value < 0:
        raise OptionError(f"option endingOffset={raw!r}: offsets are >= 0")
    return value


@dataclass(frozen=True)
class ReadOptions:
    params: AMQPParams
    queue: str
    starting_offset: StartSpec
    ending_offset: int | str
    max_messages_per_trigger: int | None
    max_messages_per_partition: int
    prefetch: int | None  # None: not given, each kind's default (stream_prefetch, queue_prefetch)
    consumers: int = 2
    idle_timeout: float = 0.5
    queue_type: str = "auto"  # or one of QUEUE_TYPES: the driver does not find the kind out then
    given: frozenset[str] = frozenset()

    QUEUE_TYPES = ("stream", "classic", "quorum")

    # Options that mean something for one kind of queue only: given for the other, they are refused.
    STREAM_ONLY = ("startingOffset", "endingOffset", "maxMessagesPerPartition")
    QUEUE_ONLY = ("consumers", "idleTimeout")

    @property
    def stream_prefetch(self) -> int:
        return self.prefetch or STREAM_PREFETCH

    @property
    def queue_prefetch(self) -> int:
        return self.prefetch or QUEUE_PREFETCH

    def check_kind(self, stream: bool) -> None:
        """Refuse options of the other kind of queue (one clear error instead of a silent no-op)."""
        wrong = [name for name in (self.QUEUE_ONLY if stream else self.STREAM_ONLY) if name.lower() in self.given]
        if wrong:
            kind = "a stream queue" if stream else "a classic or quorum queue"
            meant = "classic and quorum queues" if stream else "stream queues (offsets)"
            raise OptionError(f"option {wrong[0]} does not apply to queue {self.queue!r}, which is {kind}: it is "
                              f"for {meant} only; remove it")

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        opts = _lower(options)
        queue = opts.get("queue", "")
        if not queue:
            raise OptionError("option `queue` is required for reading: the name of a classic, quorum or stream queue")
        return cls(params=_params(opts), queue=queue,
                   starting_offset=parse_start(opts.get("startingoffset")),
                   ending_offset=parse_end(opts.get("endingoffset")),
                   max_messages_per_trigger=_int(opts, "maxMessagesPerTrigger", None),
                   max_messages_per_partition=_int(opts, "maxMessagesPerPartition", 500_000) or 500_000,
                   prefetch=_int(opts, "prefetch", None),
                   consumers=_int(opts, "consumers", 2) or 2,
                   idle_timeout=_float(opts, "idleTimeout", 0.5),
                   queue_type=_queue_type(opts.get("queuetype")),
                   given=frozenset(opts))


def _queue_type(raw: str | None) -> str:
    if raw is None or raw.strip() == "":
        return "auto"
    kind = raw.strip().lower()
    if kind not in ("auto", *ReadOptions.QUEUE_TYPES):
        raise OptionError(f"option queueType={raw!r}: expected auto, stream, classic or quorum")
    return kind
