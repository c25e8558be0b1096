"""A virtual host: its exchanges, queues and bindings, their definitions log, and its store."""

from __future__ import annotations

import asyncio
import base64
import logging
import os
from array import array
from collections.abc import Iterable
from pathlib import Path
from time import time_ns
from typing import TYPE_CHECKING, Any

from pamqp import commands

from ..amqp.constants import (
    ACCESS_REFUSED,
    COMMAND_INVALID,
    NOT_FOUND,
    PRECONDITION_FAILED,
    RESOURCE_LOCKED,
)
from ..amqp.errors import AMQPChannelError, AMQPConnectionError
from ..amqp.properties import peek_delivery_mode, peek_headers, replace_headers
from ..store.definitions import DefinitionsLog
from ..store.record import StoredMessage
from ..store.stream_index import open_stream_index
from ..store.vhost_store import VhostStore
from .exchanges.base import Exchange
from .exchanges.default import DefaultExchange
from .exchanges.registry import UnknownExchangeType, make_exchange
from .queue import Queue
from .stream_queue import StreamQueue, validate_stream_declare

if TYPE_CHECKING:
    from ..config import Config
    from .broker import Broker

log = logging.getLogger("lavinpy.vhost")

BUILTIN_EXCHANGES = (
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
)
_HEADERS_FLAG_HIGH = (1 << 13) >> 8  # the headers bit within the first property-flags byte
# Per durable queue, written at a clean stop: positions of ready messages that had been delivered.
REDELIVERED_FILE = "redelivered"
# Every this many flusher ticks, sealed segments' pages are dropped from the broker's mapping (RSS).
RELEASE_MEMORY_TICKS = 10


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    return str(value)


def _inequivalent(arg: str, kind: str, name: str, vhost: str, received: Any, current: Any) -> AMQPChannelError:
    return AMQPChannelError(
        PRECONDITION_FAILED,
        f"inequivalent arg '{arg}' for {kind} '{name}' in vhost '{vhost}': "
        f"received '{_fmt(received)}' but current is '{_fmt(current)}'",
    )


def _check_arguments(kind: str, name: str, vhost: str, received: dict, current: dict) -> None:
    for key in sorted(set(received) | set(current)):
        if received.get(key) != current.get(key):
            raise _inequivalent(key, kind, name, vhost, received.get(key), current.get(key))


class VHost:
    def __init__(self, name: str, path: Path, config: Config, broker: Broker) -> None:
        self.name = name
        self.broker = broker
        self.path = path
        self.config = config
        self.store = VhostStore(
            path,
            segment_size=config.segment_size,
            fsync=config.fsync,
            fsync_interval_ms=config.fsync_interval_ms,
            ack_file_max_bytes=config.ack_file_max_bytes,
        )
        self.definitions = DefinitionsLog(path / "definitions.amqp", config.definitions_compact_deletes)
        self.exchanges: dict[str, Exchange] = {}
        self.generation = 0  # bumped when an exchange goes away: channels cache resolved exchanges
        self.queues: dict[str, Queue] = {}
        self._flush_task: asyncio.Task | None = None
        self.closed = False

    # --- lifecycle ----------------------------------------------------------------------------
    def open(self, unclean_stop: bool = False) -> None:
        self.store.open()
        self.default_exchange = DefaultExchange(self.queues.get)
        self.exchanges[""] = self.default_exchange
        for name, type_name in BUILTIN_EXCHANGES:
            self.exchanges[name] = make_exchange(type_name, name, durable=True)
        for cmd in self.definitions.load():
            self._replay(cmd, unclean_stop)
        self.store.finish_recovery()
        self.store.messages.release_memory()
        recovered = sum(q.message_count for q in self.queues.values())
        log.info("vhost %r opened: %d exchanges, %d queues, %d messages", self.name,
                 len(self.exchanges), len(self.queues), recovered)

    def _replay(self, cmd: Any, unclean_stop: bool) -> None:
        if isinstance(cmd, commands.Exchange.Declare):
            if cmd.exchange in self.exchanges:
                return
            try:
                self.exchanges[cmd.exchange] = make_exchange(
                    cmd.exchange_type, cmd.exchange, durable=True, auto_delete=cmd.auto_delete,
                    internal=cmd.internal, arguments=dict(cmd.arguments or {}))
            except UnknownExchangeType:
                log.error("vhost %r: exchange %r has unknown type %r; skipped", self.name,
                          cmd.exchange, cmd.exchange_type)
        elif isinstance(cmd, commands.Queue.Declare):
            if (cmd.arguments or {}).get("x-queue-type") == "stream":
                self.queues[cmd.queue] = StreamQueue(self, cmd.queue, open_stream_index(self.store, cmd.queue),
                                                     arguments=dict(cmd.arguments or {}))
                return
            index = self.store.open_queue(cmd.queue, durable=True)
            queue = Queue(self, cmd.queue, index, durable=True, auto_delete=cmd.auto_delete,
                          arguments=dict(cmd.arguments or {}), recovered_redelivered=unclean_stop)
            marks = self.store.queue_path(cmd.queue) / REDELIVERED_FILE
            if marks.exists():
                if not unclean_stop:
                    queue.mark_redelivered(array("Q", marks.read_bytes()[: marks.stat().st_size // 8 * 8]))
                marks.unlink()
            self.queues[cmd.queue] = queue
        elif isinstance(cmd, commands.Queue.Bind):
            source, dest = self.exchanges.get(cmd.exchange), self.queues.get(cmd.queue)
            if source is not None and dest is not None:
                source.bind(dest, cmd.routing_key, dict(cmd.arguments or {}))
        elif isinstance(cmd, commands.Exchange.Bind):
            source, dest = self.exchanges.get(cmd.source), self.exchanges.get(cmd.destination)
            if source is not None and dest is not None:
                source.bind(dest, cmd.routing_key, dict(cmd.arguments or {}))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for queue in list(self.queues.values()):
            if not queue.durable:
                self.store.delete_queue(queue.index)
            elif queue.index.durable:
                self._save_redelivered(queue)
        self.store.close()
        self.definitions.close()

    def _save_redelivered(self, queue: Queue) -> None:
        """Clean stop: remember which ready messages were delivered before, for their redelivered flag."""
        marks = queue.redelivered_positions()
        if marks:
            path = self.store.queue_path(queue.name) / REDELIVERED_FILE
            path.write_bytes(array("Q", marks).tobytes())

    def start_flusher(self, interval: float = 0.2) -> None:
        """Flush periodically, so acks and un-confirmed publishes reach the disk without a client asking."""
        async def run() -> None:
            ticks = 0
            while not self.closed:
                await asyncio.sleep(interval)
                ticks += 1
                if ticks % RELEASE_MEMORY_TICKS == 0:
                    self.store.messages.release_memory()
                for queue in list(self.queues.values()):
                    if isinstance(queue, StreamQueue):
                        queue.apply_retention()
                if self.store.pending and not self.closed:
                    try:
                        await self.store.flush()
                    except Exception:  # pragma: no cover - logged, the next round retries
                        log.exception("vhost %r: periodic flush failed", self.name)
        self._flush_task = asyncio.get_running_loop().create_task(run())

    # --- delivery scheduling ------------------------------------------------------------------
    def schedule_delivery(self, queue: Queue) -> None:
        self.broker.schedule_delivery(queue)

    def schedule_all_deliveries(self) -> None:
        for queue in self.queues.values():
            if queue.consumers and queue.message_count:
                self.schedule_delivery(queue)

    # --- exchanges ----------------------------------------------------------------------------
    def get_exchange(self, name: str) -> Exchange:
        try:
            return self.exchanges[name]
        except KeyError:
            raise AMQPChannelError(NOT_FOUND, f"no exchange '{name}' in vhost '{self.name}'")

    def declare_exchange(self, name: str, type_name: str, *, passive: bool = False, durable: bool = False,
                         auto_delete: bool = False, internal: bool = False,
                         arguments: dict | None = None) -> Exchange:
        arguments = dict(arguments or {})
        existing = self.exchanges.get(name)
        if passive:
            if existing is None:
                raise AMQPChannelError(NOT_FOUND, f"no exchange '{name}' in vhost '{self.name}'")
            return existing
        if name.startswith("amq.") and existing is None:
            raise AMQPChannelError(ACCESS_REFUSED,
                                   f"exchange name '{name}' contains reserved prefix 'amq.*'")
        if existing is not None:
            if name == "" or (name.startswith("amq.") and existing.type == type_name):
                return existing
            for arg, received, current in (("type", type_name, existing.type),
                                           ("durable", durable, existing.durable),
                                           ("auto_delete", auto_delete, existing.auto_delete),
                                           ("internal", internal, existing.internal)):
                if received != current:
                    raise _inequivalent(arg, "exchange", name, self.name, received, current)
            _check_arguments("exchange", name, self.name, arguments, existing.arguments)
            return existing
        try:
            exchange = make_exchange(type_name, name, durable=durable, auto_delete=auto_delete,
                                     internal=internal, arguments=arguments)
        except UnknownExchangeType:
            raise AMQPConnectionError(COMMAND_INVALID, f"unknown exchange type '{type_name}'")
        if durable:
            self.definitions.append(commands.Exchange.Declare(
                exchange=name, exchange_type=type_name, durable=True, auto_delete=auto_delete,
                internal=internal, arguments=arguments))
        self.exchanges[name] = exchange
        return exchange

    def delete_exchange(self, name: str, *, if_unused: bool = False) -> None:
        if name == "" or name.startswith("amq."):
            raise AMQPChannelError(ACCESS_REFUSED,
                                   f"exchange '{name}' in vhost '{self.name}' is built in and cannot be deleted")
        exchange = self.exchanges.get(name)
        if exchange is None:
            # RabbitMQ answers delete-ok for a missing exchange (idempotent delete).
            return
        if if_unused and exchange.has_bindings():
            raise AMQPChannelError(PRECONDITION_FAILED, f"exchange '{name}' in vhost '{self.name}' in use")
        del self.exchanges[name]
        self.generation += 1
        for other in list(self.exchanges.values()):
            if other.unbind_all(exchange):
                self._maybe_auto_delete_exchange(other)
        if exchange.durable:
            self.definitions.append(commands.Exchange.Delete(exchange=name))

    def _maybe_auto_delete_exchange(self, exchange: Exchange) -> None:
        if exchange.auto_delete and not exchange.has_bindings() and exchange.name in self.exchanges:
            self.delete_exchange(exchange.name)

    def _check_bindable(self, exchange: Exchange) -> None:
        if exchange.name == "":
            raise AMQPChannelError(ACCESS_REFUSED, "operation not permitted on the default exchange")

    def bind_queue(self, queue_name: str, exchange_name: str, routing_key: str, arguments: dict | None) -> None:
        queue = self.get_queue(queue_name)
        exchange = self.get_exchange(exchange_name)
        self._check_bindable(exchange)
        arguments = dict(arguments or {})
        if exchange.bind(queue, routing_key, arguments) and queue.durable and exchange.durable \
                and not queue.exclusive:
            self.definitions.append(commands.Queue.Bind(
                queue=queue_name, exchange=exchange_name, routing_key=routing_key, arguments=arguments))

    def unbind_queue(self, queue_name: str, exchange_name: str, routing_key: str,
                     arguments: dict | None) -> None:
        queue = self.get_queue(queue_name)
        exchange = self.get_exchange(exchange_name)
        self._check_bindable(exchange)
        arguments = dict(arguments or {})
        if exchange.unbind(queue, routing_key, arguments):
            if queue.durable and exchange.durable and not queue.exclusive:
                self.definitions.append(commands.Queue.Unbind(
                    queue=queue_name, exchange=exchange_name, routing_key=routing_key, arguments=arguments))
            self._maybe_auto_delete_exchange(exchange)

    def bind_exchange(self, destination: str, source: str, routing_key: str, arguments: dict | None) -> None:
        dest = self.get_exchange(destination)
        src = self.get_exchange(source)
        self._check_bindable(dest)
        self._check_bindable(src)
        arguments = dict(arguments or {})
        if src.bind(dest, routing_key, arguments) and src.durable and dest.durable:
            self.definitions.append(commands.Exchange.Bind(
                destination=destination, source=source, routing_key=routing_key, arguments=arguments))

    def unbind_exchange(self, destination: str, source: str, routing_key: str,
                        arguments: dict | None) -> None:
        dest = self.get_exchange(destination)
        src = self.get_exchange(source)
        self._check_bindable(dest)
        self._check_bindable(src)
        arguments = dict(arguments or {})
        if src.unbind(dest, routing_key, arguments):
            if src.durable and dest.durable:
                self.definitions.append(commands.Exchange.Unbind(
                    destination=destination, source=source, routing_key=routing_key, arguments=arguments))
            self._maybe_auto_delete_exchange(src)

    # --- queues -------------------------------------------------------------------------------
    def get_queue(self, name: str) -> Queue:
        try:
            return self.queues[name]
        except KeyError:
            raise AMQPChannelError(NOT_FOUND, f"no queue '{name}' in vhost '{self.name}'")

    def check_exclusive(self, queue: Queue, owner: object) -> None:
        if queue.exclusive_owner is not None and queue.exclusive_owner is not owner:
            raise AMQPChannelError(
                RESOURCE_LOCKED,
                f"cannot obtain exclusive access to locked queue '{queue.name}' in vhost '{self.name}'. "
                "It could be originally declared on another connection or the exclusive property "
                "value does not match that of the original declaration.")

    @staticmethod
    def generate_queue_name() -> str:
        return "amq.gen-" + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")

    def declare_queue(self, name: str, *, owner: object, passive: bool = False, durable: bool = False,
                      exclusive: bool = False, auto_delete: bool = False,
                      arguments: dict | None = None, server_named: bool = False) -> Queue:
        arguments = dict(arguments or {})
        existing = self.queues.get(name)
        if passive:
            if existing is None:
                raise AMQPChannelError(NOT_FOUND, f"no queue '{name}' in vhost '{self.name}'")
            self.check_exclusive(existing, owner)
            return existing
        if existing is None and name.startswith("amq.") and not server_named:
            raise AMQPChannelError(ACCESS_REFUSED, f"queue name '{name}' contains reserved prefix 'amq.*'")
        if existing is not None:
            self.check_exclusive(existing, owner)
            for arg, received, current in (("durable", durable, existing.durable),
                                           ("exclusive", exclusive, existing.exclusive),
                                           ("auto_delete", auto_delete, existing.auto_delete)):
                if received != current:
                    raise _inequivalent(arg, "queue", name, self.name, received, current)
            _check_arguments("queue", name, self.name, arguments, existing.arguments)
            return existing
        queue_type = arguments.get("x-queue-type", "classic")
        if queue_type not in ("classic", "stream"):
            raise AMQPChannelError(PRECONDITION_FAILED,
                                   f"invalid arg 'x-queue-type' for queue '{name}' in vhost '{self.name}': "
                                   f"queue type '{_fmt(queue_type)}' is not supported")
        if queue_type == "stream":
            if server_named:
                raise AMQPChannelError(PRECONDITION_FAILED, "Cannot declare a server-named queue for type stream")
            validate_stream_declare(name, self.name, durable=durable, exclusive=exclusive,
                                    auto_delete=auto_delete, arguments=arguments)
            self.definitions.append(commands.Queue.Declare(queue=name, durable=True, auto_delete=False,
                                                           arguments=arguments))
            stream = StreamQueue(self, name, open_stream_index(self.store, name), arguments=arguments)
            self.queues[name] = stream
            return stream  # type: ignore[return-value]
        persist = durable and not exclusive
        if persist:
            self.definitions.append(commands.Queue.Declare(
                queue=name, durable=True, auto_delete=auto_delete, arguments=arguments))
        index = self.store.open_queue(name, durable=persist)
        queue = Queue(self, name, index, durable=durable, exclusive_owner=owner if exclusive else None,
                      auto_delete=auto_delete, arguments=arguments)
        self.queues[name] = queue
        return queue

    def delete_queue(self, name: str, *, if_unused: bool = False, if_empty: bool = False) -> int:
        queue = self.queues.get(name)
        if queue is None:
            return 0
        if if_unused and not queue.is_unused():
            raise AMQPChannelError(PRECONDITION_FAILED, f"queue '{name}' in vhost '{self.name}' in use")
        if if_empty and queue.message_count:
            raise AMQPChannelError(PRECONDITION_FAILED, f"queue '{name}' in vhost '{self.name}' not empty")
        del self.queues[name]
        for exchange in list(self.exchanges.values()):
            if exchange.unbind_all(queue):
                self._maybe_auto_delete_exchange(exchange)
        count = queue.delete()
        if queue.durable and not queue.exclusive:
            self.definitions.append(commands.Queue.Delete(queue=name))
        return count

    def purge_queue(self, name: str) -> int:
        return self.get_queue(name).purge()

    def queues_owned_by(self, owner: object) -> Iterable[Queue]:
        return [q for q in self.queues.values() if q.exclusive_owner is owner]

    # --- publishing ---------------------------------------------------------------------------
    def route(self, exchange: Exchange, routing_key: str, headers: dict | None) -> set:
        queues = exchange.route(routing_key, headers)
        if headers:
            for key in ("CC", "BCC"):
                extra = headers.get(key)
                if isinstance(extra, list):
                    for rk in extra:
                        if isinstance(rk, (str, bytes)):
                            rk = rk.decode() if isinstance(rk, bytes) else rk
                            queues |= exchange.route(rk, headers)
        seen = {exchange.name}
        while not queues:
            # Unroutable: follow the alternate-exchange chain, each exchange once.
            ae_name = exchange.arguments.get("alternate-exchange")
            if isinstance(ae_name, bytes):
                ae_name = ae_name.decode()
            if not ae_name or ae_name in seen:
                break
            seen.add(ae_name)
            alternate = self.exchanges.get(ae_name)
            if alternate is None:
                break
            exchange = alternate
            queues = exchange.route(routing_key, headers)
        return queues

    def publish(self, exchange: Exchange, routing_key: str, properties: bytes, body: bytes) -> tuple[int, bool]:
        """Route and store a message once; returns (queues reached, needs an fsync for its confirm)."""
        if exchange is self.default_exchange and not properties[0] & _HEADERS_FLAG_HIGH:
            # Hot path: the default exchange without headers (no CC/BCC) reaches at most one queue.
            queue = self.queues.get(routing_key)
            queues = () if queue is None else (queue,)
        else:
            headers = peek_headers(properties) if properties[0] & _HEADERS_FLAG_HIGH else None
            queues = self.route(exchange, routing_key, headers)
            if headers and "BCC" in headers:
                headers = dict(headers)
                del headers["BCC"]
                properties = replace_headers(properties, headers)
        if not queues:
            return 0, False
        timestamp = time_ns() // 1_000_000
        messages = self.store.messages
        pos = messages.append(exchange.name, routing_key, properties, body, timestamp)
        message = StoredMessage(timestamp, exchange.name, routing_key, properties, body)
        persistent = peek_delivery_mode(properties) == 2
        needs_sync = False
        reached = 0
        for queue in queues:
            if queue.index.closed:
                continue
            queue.push(pos, persistent, message)
            reached += 1
            if persistent and queue.durable:
                needs_sync = True
        if not reached:
            # Every target is closed: the record has no reference; keep the store's refcount rule
            # (an append is followed by its pushes) by letting the next roll-over reclaim it.
            return 0, False
        return reached, needs_sync
