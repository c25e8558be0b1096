"""A virtual host: its exchanges, queues and bindings, their definitions log, and its store."""

from __future__ import annotations

import asyncio
import base64
import logging
import os
from array import array
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pamqp import commands

from ..store import changes
from ..store.append_file import AppendFile
from ..store.definitions import DefinitionsLog
from ..store.index_kinds import FIFO, STREAM
from ..store.jsonfile import write_bytes_atomic
from ..store.queue_index import QueueIndex
from ..store.record import StoredMessage
from ..store.stream_index import StreamIndex
from ..store.vhost_store import VhostStore
from ..wire.frames import build_method
from .access.client_limits import queue_limit_error
from .access.permissions import UserPermissions, check_policy
from .dead_lettering import dead_letter
from .declarations import (
    check_exchange_equivalent,
    check_exchange_name,
    check_queue_equivalent,
    check_queue_name,
    default_exchange_refused,
    new_exchange,
    validate_queue_declare,
    with_default_queue_type,
)
from .errors import ACCESS_REFUSED, NOT_FOUND, PRECONDITION_FAILED, RESOURCE_LOCKED, BrokerChannelError
from .exchanges.base import Exchange
from .exchanges.default import DefaultExchange
from .exchanges.registry import UnknownExchangeType, make_exchange
from .metrics.stats import EXCHANGE_FIELDS, MessageCounters
from .publishing import REJECTED as REJECTED  # re-exported: the channel compares with it
from .publishing import VHostPublishing
from .queues.base import QueueKind
from .queues.dedup_cache import DedupCache, file_name
from .queues.priorities import priority_kind
from .queues.queue import Queue
from .queues.stream import StreamQueue
from .recovery import orphan_queue_declares
from .routing import Routing
from .scheduler import DeliveryScheduler
from .settings.arguments import ArgumentError, QueueSettings, alternate_exchange, queue_type_of
from .settings.deduplication import settings_of
from .settings.operator_policies import merge_definitions, operator_policy_store
from .settings.policies import POLICIES_FILE, Policy, PolicyStore

if TYPE_CHECKING:
    from ..config import Config
    from .access.users import UserStore
    from .metrics.stats import NodeCounters

log = logging.getLogger("lavinpy.vhost")

BUILTIN_EXCHANGES = (
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
)
# Per durable queue, written at a clean stop: positions of ready messages that had been delivered.
REDELIVERED_FILE = "redelivered"
# Every this many flusher ticks, sealed segments' pages are dropped from the broker's mapping (RSS).
RELEASE_MEMORY_TICKS = 10


class VHostOwner(Protocol):
    """What a vhost needs of the broker that holds it (``broker.Broker`` is one)."""

    @property
    def node_counters(self) -> NodeCounters: ...

    @property
    def users(self) -> UserStore | None: ...

    @property
    def scheduler(self) -> DeliveryScheduler:
        """When the queues deliver (once per turn of the loop or input batch)."""


class VHost(VHostPublishing):
    def __init__(self, name: str, path: Path, config: Config, broker: VHostOwner) -> None:
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
        self._definitions_durable: asyncio.Future[None] | None = None  # the flush the last append waits for
        self.exchanges: dict[str, Exchange] = {}
        self.generation = 0  # bumped when an exchange goes away: channels cache resolved exchanges
        self.queues: dict[str, QueueKind] = {}
        self.corrupt_messages = 0  # damaged records found (and skipped) by this vhost's queues
        self.stats = MessageCounters()  # publishing channels' counts, and those of deleted queues
        # Deleted queues' counts again, per queue kind other than classic: the metrics label delivery
        # counters by queue type, and a deleted stream's deliveries must stay the stream type's.
        self.deleted_stats_by_kind: dict[str, MessageCounters] = {}
        self.node_counters = broker.node_counters  # held here too: the publish path reaches it in one step
        self.channel_wide_prefetches = 0  # see queues.base.QueueHost
        self._flush_task: asyncio.Task | None = None
        self.closed = False
        self.policies = PolicyStore(path / POLICIES_FILE)
        self.policies.subscribe(self._policy_changed)
        self.operator_policies = operator_policy_store(path)
        self.operator_policies.subscribe(self._policy_changed)
        self.max_queues: int | None = None  # the vhost-limits max-queues (None: no limit)
        self.routing = Routing(self.exchanges)  # alternate exchanges are set as policies give them

    # --- lifecycle ----------------------------------------------------------------------------
    def open(self, unclean_stop: bool = False) -> None:
        self.store.open()
        self.default_exchange = DefaultExchange(self.queues.get)
        self.exchanges[""] = self.default_exchange
        for name, type_name in BUILTIN_EXCHANGES:
            self.exchanges[name] = make_exchange(type_name, name, durable=True)
        try:
            self.policies.load()
            self.operator_policies.load()
        except (OSError, ValueError) as e:
            log.error("vhost %r: policies not loaded: %s", self.name, e)
        # Delayed exchanges open their held-message index during the replay: before finish_recovery,
        # which deletes the segments no open index references.
        replay = self.definitions.load()
        if self.definitions.damaged_records:
            for orphan in orphan_queue_declares(self.name, self.store, replay):
                self.definitions.append(orphan)
            replay = self.definitions.current()  # exchanges, queues, then bindings
        for cmd in replay:
            self._replay(cmd, unclean_stop)
        # From now on the group commit syncs the definitions: many declarations, one fsync.
        self.store.register_synced_file(self.definitions)
        self.definitions.group_commit = True
        self.definitions.on_append = self._definitions_appended
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
                exchange = make_exchange(
                    cmd.exchange_type, cmd.exchange, durable=True, auto_delete=cmd.auto_delete,
                    internal=cmd.internal, arguments=dict(cmd.arguments or {}))
            except (UnknownExchangeType, ArgumentError) as e:
                log.error("vhost %r: exchange %r (type %r) skipped: %s", self.name,
                          cmd.exchange, cmd.exchange_type, e)
                return
            self._add_exchange(exchange)
        elif isinstance(cmd, commands.Queue.Declare):
            arguments = dict(cmd.arguments or {})
            if queue_type_of(arguments) == "stream":
                self.queues[cmd.queue] = self._new_stream(cmd.queue, arguments)
                return
            settings = self._queue_settings(cmd.queue, arguments)
            index = self._open_index(cmd.queue, True, settings)
            queue = Queue(self, cmd.queue, index, durable=True, auto_delete=cmd.auto_delete,
                          arguments=arguments, recovered_redelivered=unclean_stop, settings=settings)
            marks = self.store.queue_path(cmd.queue) / REDELIVERED_FILE
            if marks.exists():
                if not unclean_stop:
                    queue.mark_redelivered(array("Q", marks.read_bytes()[: marks.stat().st_size // 8 * 8]))
                marks.unlink()
                changes.deleted(marks)  # a durable file: replicated like the store's
            self.queues[cmd.queue] = queue
        elif isinstance(cmd, commands.Queue.Bind):
            source, bound = self.exchanges.get(cmd.exchange), self.queues.get(cmd.queue)
            if source is not None and bound is not None:
                source.bind(bound, cmd.routing_key, dict(cmd.arguments or {}))
        elif isinstance(cmd, commands.Exchange.Bind):
            source, destination = self.exchanges.get(cmd.source), self.exchanges.get(cmd.destination)
            if source is not None and destination is not None:
                source.bind(destination, cmd.routing_key, dict(cmd.arguments or {}))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for exchange in self.exchanges.values():
            exchange.close()
        for queue in list(self.queues.values()):
            queue.stop_timers()
            if not queue.durable:
                self.store.delete_queue(queue.index)
            elif queue.index.durable:
                self._save_redelivered(queue)
        self.store.close()
        self.definitions.close()

    def _save_redelivered(self, queue: QueueKind) -> None:
        """Clean stop: remember which ready messages were delivered before, for their redelivered flag."""
        marks = queue.redelivered_positions()
        if marks:
            # A queue's directory is made by its first write, which may still be waiting for a flush.
            queue.index.ensure_directory()
            path = self.store.queue_path(queue.name) / REDELIVERED_FILE
            write_bytes_atomic(path, array("Q", marks).tobytes())

    def write_queue_state(self) -> None:
        """Write every queue's periodic state (a stream's tracked offsets and filter-value tags) now,
        not at the periodic task's next turn; a ``store.flush()`` after it makes it durable."""
        for queue in list(self.queues.values()):
            queue.write_state()

    def start_flusher(self, interval: float = 0.2) -> None:
        """Flush periodically, so acks and un-confirmed publishes reach the disk without a client asking."""
        self._start_timers()
        async def run() -> None:
            ticks = 0
            while not self.closed:
                await asyncio.sleep(interval)
                ticks += 1
                if ticks % RELEASE_MEMORY_TICKS == 0:
                    self.store.messages.release_memory()
                for queue in list(self.queues.values()):
                    queue.apply_retention()
                if self.store.pending and not self.closed:
                    try:
                        await self.store.flush()
                    except Exception:  # pragma: no cover - logged, the next round retries
                        log.exception("vhost %r: periodic flush failed", self.name)
        self._flush_task = asyncio.get_running_loop().create_task(run())

    # --- durability (sessions and faces ask the vhost, not the store) ----------------------------
    def durable(self, acks: bool = True) -> asyncio.Future[None]:
        """A future that resolves once what was stored before the call is on disk (as the fsync policy
        says) and, in a cluster, with every in-sync follower; ``acks=False`` (publisher confirms):
        messages only. Shared with other callers: add a done callback, never cancel it."""
        return self.store.durable(acks)

    def append_file(self, name: str) -> AppendFile:
        """A file of the faces' own in the vhost's directory (MQTT's retained messages), opened once:
        appends are replicated with the store's files and synced by its group commit, so a caller
        that must know one durable waits for ``durable()``."""
        return self.store.open_append_file(name)

    def replicated(self) -> asyncio.Future[None] | None:
        """A future that resolves once every in-sync follower has what was written before the call
        and the definitions appended are on disk per the fsync policy; None when the change is
        complete at once (outside a cluster, no definitions awaiting a flush)."""
        pending = self.definitions_pending()
        if pending is not None:
            return pending
        barrier = self.store.barrier
        return None if barrier is None else barrier.wait_replicated()

    def definitions_pending(self) -> asyncio.Future[None] | None:
        """While a definitions append awaits its flush: a flush joined now (it covers the caller's
        change too and resolves no earlier than that one), else None."""
        pending = self._definitions_durable
        if pending is None:
            return None
        if pending.done():
            self._definitions_durable = None
            return None
        return self.store.durable(acks=False)

    def _definitions_appended(self) -> None:
        store = self.store
        if store.fsync_policy == "never" and store.barrier is None:
            return  # handed to the OS is all the policy asks
        try:
            self._definitions_durable = store.durable(acks=False)
        except RuntimeError:  # no event loop (a caller outside the server): sync now
            self.definitions.sync()

    # --- delivery scheduling ------------------------------------------------------------------
    def schedule_delivery(self, queue: QueueKind) -> None:
        self.broker.scheduler.schedule_delivery(queue)

    # --- exchanges ----------------------------------------------------------------------------
    def get_exchange(self, name: str) -> Exchange:
        try:
            return self.exchanges[name]
        except KeyError:
            raise BrokerChannelError(NOT_FOUND, f"no exchange '{name}' in vhost '{self.name}'")

    def declare_exchange(self, name: str, type_name: str, *, passive: bool = False, durable: bool = False,
                         auto_delete: bool = False, internal: bool = False,
                         arguments: dict | None = None, permissions: UserPermissions | None = None) -> Exchange:
        """Declare an exchange; ``permissions`` is the acting user's (None: a trusted caller)."""
        arguments = dict(arguments or {})
        if name == "":
            raise default_exchange_refused()
        existing = self.exchanges.get(name)
        if passive:
            if existing is None:
                raise BrokerChannelError(NOT_FOUND, f"no exchange '{name}' in vhost '{self.name}'")
            return existing
        if permissions is not None:
            permissions.check_exchange_declare(name, arguments)
        check_exchange_name(name, exists=existing is not None)
        if existing is not None:
            check_exchange_equivalent(existing, self.name, type_name, durable, auto_delete, internal, arguments)
            return existing
        exchange = new_exchange(type_name, name, durable=durable, auto_delete=auto_delete, internal=internal,
                                arguments=arguments)
        if durable:
            self.definitions.append(build_method(
                commands.Exchange.Declare, exchange=name, exchange_type=type_name, durable=True,
                auto_delete=auto_delete, internal=internal, arguments=arguments))
        self._add_exchange(exchange)
        return exchange

    def _add_exchange(self, exchange: Exchange) -> None:
        self.exchanges[exchange.name] = exchange
        exchange.attach(self.store, self._route_due)
        dedup = settings_of(exchange.arguments)
        if dedup is not None:
            exchange.dedup = DedupCache(dedup, self.store.open_append_file(file_name("x", exchange.name))
                                        if exchange.durable else None)
        self._update_alternate(exchange)

    def _update_alternate(self, exchange: Exchange) -> None:
        policy = self.policies.match(exchange.name, "exchange")
        ae = alternate_exchange(exchange.arguments, policy.definition if policy else None)
        self.routing.set_alternate(exchange.name, ae)

    def delete_exchange(self, name: str, *, if_unused: bool = False) -> None:
        if name == "" or name.startswith("amq."):
            raise BrokerChannelError(ACCESS_REFUSED,
                                     f"exchange '{name}' in vhost '{self.name}' is built in and cannot be deleted")
        exchange = self.exchanges.get(name)
        if exchange is None:
            # RabbitMQ answers delete-ok for a missing exchange (idempotent delete).
            return
        if if_unused and exchange.has_bindings():
            raise BrokerChannelError(PRECONDITION_FAILED, f"exchange '{name}' in vhost '{self.name}' in use")
        del self.exchanges[name]
        exchange.stats.fold_into(self.stats, EXCHANGE_FIELDS)
        self.routing.set_alternate(name, None)
        exchange.delete()
        if exchange.dedup is not None and exchange.durable:
            self.store.delete_append_file(file_name("x", name))
        self.generation += 1
        for other in list(self.exchanges.values()):
            if other.unbind_all(exchange):
                self._maybe_auto_delete_exchange(other)
        if exchange.durable:
            self.definitions.append(build_method(commands.Exchange.Delete, exchange=name))

    def _maybe_auto_delete_exchange(self, exchange: Exchange) -> None:
        if exchange.auto_delete and not exchange.has_bindings() and exchange.name in self.exchanges:
            self.delete_exchange(exchange.name)

    def _check_bindable(self, exchange: Exchange) -> None:
        if exchange.name == "":
            raise default_exchange_refused()

    def bind_queue(self, queue_name: str, exchange_name: str, routing_key: str, arguments: dict | None) -> None:
        queue = self.get_queue(queue_name)
        exchange = self.get_exchange(exchange_name)
        self._check_bindable(exchange)
        arguments = dict(arguments or {})
        if exchange.bind(queue, routing_key, arguments) and queue.durable and exchange.durable \
                and not queue.exclusive:
            self.definitions.append(build_method(
                commands.Queue.Bind, queue=queue_name, exchange=exchange_name, routing_key=routing_key,
                arguments=arguments))

    def unbind_queue(self, queue_name: str, exchange_name: str, routing_key: str,
                     arguments: dict | None) -> None:
        queue = self.queues.get(queue_name)
        exchange = self.exchanges.get(exchange_name)
        if exchange is not None:
            self._check_bindable(exchange)
        if queue is None or exchange is None:
            return  # as RabbitMQ: removing a binding that cannot exist is not an error
        arguments = dict(arguments or {})
        if exchange.unbind(queue, routing_key, arguments):
            if queue.durable and exchange.durable and not queue.exclusive:
                self.definitions.append(build_method(
                    commands.Queue.Unbind, queue=queue_name, exchange=exchange_name, routing_key=routing_key,
                    arguments=arguments))
            self._maybe_auto_delete_exchange(exchange)

    def bind_exchange(self, destination: str, source: str, routing_key: str, arguments: dict | None) -> None:
        dest = self.get_exchange(destination)
        src = self.get_exchange(source)
        self._check_bindable(dest)
        self._check_bindable(src)
        arguments = dict(arguments or {})
        if src.bind(dest, routing_key, arguments) and src.durable and dest.durable:
            self.definitions.append(build_method(
                commands.Exchange.Bind, destination=destination, source=source, routing_key=routing_key,
                arguments=arguments))

    def unbind_exchange(self, destination: str, source: str, routing_key: str,
                        arguments: dict | None) -> None:
        dest = self.exchanges.get(destination)
        src = self.exchanges.get(source)
        for exchange in (dest, src):
            if exchange is not None:
                self._check_bindable(exchange)
        if dest is None or src is None:
            return  # as RabbitMQ: removing a binding that cannot exist is not an error
        arguments = dict(arguments or {})
        if src.unbind(dest, routing_key, arguments):
            if src.durable and dest.durable:
                self.definitions.append(build_method(
                    commands.Exchange.Unbind, destination=destination, source=source, routing_key=routing_key,
                    arguments=arguments))
            self._maybe_auto_delete_exchange(src)

    # --- queues -------------------------------------------------------------------------------
    def get_queue(self, name: str) -> QueueKind:
        try:
            return self.queues[name]
        except KeyError:
            raise BrokerChannelError(NOT_FOUND, f"no queue '{name}' in vhost '{self.name}'")

    def check_exclusive(self, queue: QueueKind, owner: object) -> None:
        if queue.exclusive_owner is not None and queue.exclusive_owner is not owner:
            raise self._locked(queue.name)

    def _locked(self, name: str) -> BrokerChannelError:
        return BrokerChannelError(
            RESOURCE_LOCKED,
            f"cannot obtain exclusive access to locked queue '{name}' in vhost '{self.name}'. "
            "It could be originally declared on another connection or the exclusive property "
            "value does not match that of the original declaration.")

    @staticmethod
    def generate_queue_name() -> str:
        return "amq.gen-" + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")

    def declare_queue(self, name: str, *, owner: object, passive: bool = False, durable: bool = False,
                      exclusive: bool = False, auto_delete: bool = False,
                      arguments: dict | None = None, server_named: bool = False,
                      permissions: UserPermissions | None = None) -> QueueKind:
        """Declare a queue; ``permissions`` is the acting user's (None: a trusted caller)."""
        arguments = dict(arguments or {})
        existing = self.queues.get(name)
        if passive:
            if existing is None:
                raise BrokerChannelError(NOT_FOUND, f"no queue '{name}' in vhost '{self.name}'")
            self.check_exclusive(existing, owner)
            return existing
        if permissions is not None:
            permissions.check_queue_declare(name, arguments)
        users = self.broker.users
        record = users.vhost(self.name) if users is not None else None
        if record is not None and record.default_queue_type:  # RabbitMQ 4: the vhost's type, written in
            arguments = with_default_queue_type(arguments, record.default_queue_type, durable=durable,
                                                exclusive=exclusive, auto_delete=auto_delete)
        check_queue_name(name, exists=existing is not None, server_named=server_named)
        if existing is not None:
            self.check_exclusive(existing, owner)
            if exclusive != existing.exclusive:
                # As RabbitMQ: exclusivity is a lock, not an argument to compare.
                raise self._locked(name)
            check_queue_equivalent(existing.durable, existing.auto_delete, existing.arguments, name, self.name,
                                   durable, auto_delete, arguments)
            existing.touch()  # a redeclare counts as use (x-expires)
            self.node_counters.queues_declared += 1
            return existing
        queue_type = validate_queue_declare(name, self.name, durable=durable, exclusive=exclusive,
                                            auto_delete=auto_delete, arguments=arguments, server_named=server_named)
        if self.max_queues is not None and len(self.queues) >= self.max_queues:
            raise queue_limit_error(name, self.name, self.max_queues)
        if queue_type == "stream":
            self.definitions.append(build_method(commands.Queue.Declare, queue=name, durable=True, auto_delete=False,
                                               arguments=arguments))
            stream = self._new_stream(name, arguments)
            self.queues[name] = stream
            self._count_created()
            return stream
        settings = self._queue_settings(name, arguments)
        persist = durable and not exclusive
        if persist:
            self.definitions.append(build_method(
                commands.Queue.Declare, queue=name, durable=True, auto_delete=auto_delete, arguments=arguments))
        index = self._open_index(name, persist, settings)
        queue = Queue(self, name, index, durable=durable, exclusive_owner=owner if exclusive else None,
                      auto_delete=auto_delete, arguments=arguments, settings=settings)
        self.queues[name] = queue
        self._count_created()
        return queue

    def _count_created(self) -> None:
        # As RabbitMQ: a declare that creates the queue counts as declared and as created; recovery
        # at boot builds queues without declaring them and counts neither.
        counters = self.node_counters
        counters.queues_declared += 1
        counters.queues_created += 1

    def _new_stream(self, name: str, arguments: dict) -> StreamQueue:
        index = self.store.open_queue(name, True, STREAM)
        assert isinstance(index, StreamIndex)
        return StreamQueue(self, name, index, arguments=arguments)

    def _queue_settings(self, name: str, arguments: dict) -> QueueSettings:
        queue_type = queue_type_of(arguments)
        policy = self.policies.match(name, "queue", queue_type)
        definition = policy.definition if policy else None
        if len(self.operator_policies):  # the stricter of policy and operator policy (RabbitMQ's merge)
            operator = self.operator_policies.match(name, "queue", queue_type)
            if operator is not None:
                definition = merge_definitions(definition, operator.definition)
        return QueueSettings.resolve(arguments, definition, policy.name if policy else None)

    def _open_index(self, name: str, persist: bool, settings: QueueSettings) -> QueueIndex:
        kind = priority_kind(settings.max_priority, settings.default_priority) if settings.max_priority else FIFO
        index = self.store.open_queue(name, persist, kind)
        assert isinstance(index, QueueIndex)
        return index

    def delete_queue(self, name: str, *, if_unused: bool = False, if_empty: bool = False) -> int:
        queue = self.queues.get(name)
        if queue is None:
            return 0
        if if_unused and not queue.is_unused():
            raise BrokerChannelError(PRECONDITION_FAILED, f"queue '{name}' in vhost '{self.name}' in use")
        if if_empty and queue.message_count:
            raise BrokerChannelError(PRECONDITION_FAILED, f"queue '{name}' in vhost '{self.name}' not empty")
        del self.queues[name]
        self.node_counters.queues_deleted += 1
        for exchange in list(self.exchanges.values()):
            if exchange.unbind_all(queue):
                self._maybe_auto_delete_exchange(exchange)
        count = queue.delete()
        queue.stats.fold_into(self.stats)
        if queue.kind != "classic":
            queue.stats.fold_into(self.deleted_stats_by_kind.setdefault(queue.kind, MessageCounters()))
        if queue.durable and not queue.exclusive:
            self.definitions.append(build_method(commands.Queue.Delete, queue=name))
        return count

    def set_queue_arguments(self, queue: QueueKind, arguments: dict) -> None:
        """New arguments for a classic or quorum queue (checked by the caller): a durable queue's
        definition is written again (the last declare of a name is the one replayed), and the queue
        enforces them at once, as after a policy change."""
        if queue.durable and not queue.exclusive:
            self.definitions.append(build_method(commands.Queue.Declare, queue=queue.name, durable=True,
                                                 auto_delete=queue.auto_delete, arguments=arguments))
        queue.arguments = arguments
        queue.apply_settings(self._queue_settings(queue.name, arguments))

    def purge_queue(self, name: str) -> int:
        return self.get_queue(name).purge()

    def queues_owned_by(self, owner: object) -> Iterable[QueueKind]:
        return [q for q in self.queues.values() if q.exclusive_owner is owner]

    def dead_letter(self, queue: QueueKind, msg: StoredMessage, reason: str) -> int:
        """Send ``msg`` leaving ``queue`` to its dead-letter exchange (see ``dead_lettering``)."""
        return dead_letter(self, queue, msg, reason)

    # --- policies -----------------------------------------------------------------------------
    def set_policy(self, name: str, pattern: str, definition: dict, priority: int = 0,
                   apply_to: str = "all", user: str | None = None) -> Policy:
        """Add or replace a policy (saved to policies.json); matching queues apply it at once.

        ``user`` is the acting user (None: a trusted caller); see ``permissions.check_policy``.
        """
        if user is not None:
            assert self.broker.users is not None
            check_policy(self.broker.users, user, self.name, definition)
        return self.policies.set(name, pattern, definition, priority, apply_to)

    def delete_policy(self, name: str) -> bool:
        return self.policies.delete(name)

    def _policy_changed(self, _name: str) -> None:
        for queue in list(self.queues.values()):
            if not queue.deleted:
                queue.apply_settings(self._queue_settings(queue.name, queue.arguments))
        for exchange in self.exchanges.values():
            if exchange.name:
                self._update_alternate(exchange)

    def _start_timers(self) -> None:
        for queue in self.queues.values():
            queue.start_timers()
        for exchange in self.exchanges.values():
            exchange.start_timers()
