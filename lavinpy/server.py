"""Starts and stops everything: the broker, the AMQP listener, signal handling."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import signal
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .amqp.log import log_bad_proxy_header
from .amqp.sessions import Sessions
from .amqp.spool import BodySpool
from .amqp.transport import AMQPProtocol, LoopScheduling
from .broker.ops import FEDERATION_UPSTREAM as UPSTREAM
from .broker.ops import Broker, Face, queue_type_of
from .broker.ops.definitions.documents import LoadDefinitionsError, load_definitions_file
from .broker.ops.limits import LimitsOperations
from .broker.ops.node_info import node_name
from .config import Config
from .federation.component import Federation, UpstreamComponent, UpstreamSetComponent
from .listeners import ProxyPolicy, serve_port
from .logs import configure_logging, reopen_log_file
from .shovel.component import LocalNode, ShovelComponent, Shovels
from .shovel.registry import LinkRegistry
from .store.lock import DataDirLocked
from .systemd_notify import Notifier
from .tls import ServerTLS
from .wire import accel
from .wire.proxy_header import TrustedSources

if TYPE_CHECKING:
    import ssl

    from aiohttp import web

    from .cluster.node import ClusterNode
    from .http.gate import HttpGate
    from .mqtt.sessions import MQTTSessions

log = logging.getLogger("lavinpy")
# The cyclic garbage collector's thresholds (Python's defaults: 700, 10, 10). A full collection walks every
# object alive, and message traffic makes one every few thousand messages with the defaults (objects in
# flight get promoted to the oldest generation), so its cost grew with each open connection's objects:
# 5,000 idle connections cut a busy client's throughput to a quarter. Young collections this much rarer
# promote (and so trigger) a small fraction of that.
GC_THRESHOLDS = (50_000, 20, 10)
# glibc's malloc: a block from this size on is its own mmap, and free memory above this at the heap's top
# goes back to the kernel. With the defaults (128 KiB, adjusted as blocks are freed) the buffers of a
# delivery run and of a socket thread (hundreds of KiB, one per run) were mapped, faulted in page by page
# and unmapped again, or the heap's top was trimmed and grown again: in scenario b 0.25 page faults per
# message, about a tenth of the event loop's time. With these the pages stay in the heap.
MALLOC_MMAP_THRESHOLD = 1024 * 1024
MALLOC_TRIM_THRESHOLD = 4 * 1024 * 1024
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (malloc.h)
# Prometheus scrapes directly (RabbitMQ's prometheus plugin has no PROXY protocol either).
NO_PROXY = ProxyPolicy(TrustedSources([]), refused=log_bad_proxy_header)


class SessionLayers:
    """The model's ``SessionLayer`` over the faces registered with it, in order: alarms and a deleted
    vhost reach every face. When deliveries run is the model's (``broker.scheduler``), for every face."""

    def __init__(self) -> None:
        self.faces: list[Face] = []

    def register(self, face: Face) -> None:
        self.faces.append(face)

    def resources_changed(self, reason: str | None) -> None:
        for face in self.faces:
            face.resources_changed(reason)

    def close_vhost_connections(self, vhost: str, reason: str) -> None:
        for face in self.faces:
            face.close_vhost_connections(vhost, reason)


class Server:
    def __init__(self, config: Config, cluster: ClusterNode | None = None) -> None:
        """``cluster``: the node this server runs for as the cluster's leader (None: a single broker)."""
        self.config = config
        self.cluster = cluster
        # Configured load balancers must start with a PROXY header; cluster members forward clients after
        # one (and may also connect directly); from anyone else a PROXY header is bad input.
        self.proxy_policy = ProxyPolicy(TrustedSources(config.proxy_protocol_trusted_sources),
                                        cluster.accepts_proxy_from if cluster is not None else None,
                                        log_bad_proxy_header,
                                        cluster.accepts_proxy_now if cluster is not None else None)
        self.broker = broker = Broker(config)
        # The sessions' event loop and files: body spools in the data dir (known once the broker is open).
        self.sessions = Sessions(broker, LoopScheduling(), lambda: BodySpool(broker.datadir.path))
        # MQTT clients on the same model, once start() finds an MQTT listener configured (mqtt_enabled).
        self.mqtt: MQTTSessions | None = None
        # The faces, each on the model's operations; a new protocol's sessions are one more entry.
        self.layers = SessionLayers()
        self.layers.register(self.sessions)
        broker.sessions = self.layers
        self._listeners: list[Any] = []
        self.tls: ServerTLS | None = None
        self._http_listeners: list[Any] = []  # the management API's and /metrics' ports, bound at start
        self.http_gate: HttpGate | None = None  # their connections' way in, loading the HTTP stack on the first
        self.http_servers: list[Any] = []  # the aiohttp servers, once loaded (management, metrics)
        self.stopped = asyncio.Event()
        # Shovels run with the broker: in a cluster only the leader runs a Server, so only it shovels.
        # "amqp://" (no host) is this node's AMQP port over loopback (lavinpy.shovel.component.LocalNode),
        # logged in as the shovel's creator by the internal mechanism (broker/access/internal_login.py): no
        # password, and a token that is good only from this host and this process.
        local_host = next((h for h in config.bind if h not in ("0.0.0.0", "::")), "127.0.0.1")
        broker.internal_logins.set_own_hosts([local_host])
        self.shovels = Shovels(LocalNode(local_host, config.amqp_port, broker.internal_logins.token))

        def creator(vhost: str, name: str) -> str:  # a parameter stored before creators were: the default user's
            return broker.parameters.user_of("shovel", vhost, name) or config.default_user

        def refusal(vhost: str, name: str) -> str | None:  # the creator's rights, again at each start
            return LimitsOperations(broker).link_refusal("shovel", vhost, name) if broker.users is not None else None

        self.shovels.authorize = refusal
        # A pause is stored with the shovel's parameter: it outlives a restart and a change of leader.
        self.shovels.store_pause = lambda vhost, name, paused: broker.parameters.set_paused(
            "shovel", vhost, name, paused)
        self.shovels.stored_pause = lambda vhost, name: broker.parameters.is_paused("shovel", vhost, name)
        self.shovel_component = ShovelComponent(self.shovels, creator)  # the registry's "shovel" component
        broker.parameters.register(self.shovel_component)
        # A finished one-off shovel, or one deleted through /api/shovels, takes its parameter with it.
        def drop_parameter(vhost: str, name: str) -> None:
            broker.parameters.delete("shovel", vhost, name)
        self.shovels.on_finished = drop_parameter
        self.federation = federation_of(broker, config.default_user, self.shovels.local)
        # Every link of the node, whatever its kind, for what reads them all (the Prometheus endpoint).
        self.links = LinkRegistry()
        self.links.register("shovel", self.shovels.status)
        self.links.register("federation", self.federation.status)

    async def start(self) -> None:
        config = self.config
        if config.tls_enabled:
            self.tls = ServerTLS(config)  # bad certificate files stop the start before anything is opened
        self.broker.open()
        if config.load_definitions:
            changes = load_definitions_file(self.broker, config.load_definitions)
            log.info("definitions loaded from %s: %d changes", config.load_definitions, len(changes))
        if self.cluster is not None:
            self.cluster.attach(self.broker)  # replication hooks in before any client is accepted
        try:
            self._listeners = await serve_port(lambda header: AMQPProtocol(self.sessions, header), config.bind,
                                               config.amqp_port, "AMQP", self.proxy_policy)
            if self.tls is not None and config.amqps_enabled:
                self._listeners += await serve_port(lambda header: AMQPProtocol(self.sessions, header), config.bind,
                                                    config.amqps_port, "AMQPS", self.proxy_policy,
                                                    self.tls.listener_context)
            await self._start_mqtt()
            await self._start_http()
        except BaseException:
            self._close_listeners()
            await self._stop_http()
            raise
        self.broker.start()
        if self.cluster is not None and not self.broker.parameters.get_global("cluster_name"):
            # One name for the cluster, whichever node leads (RabbitMQ's: the first node's, kept): federation
            # links name their upstream queue after it, so a new leader's links take over the same queues.
            self.broker.parameters.set_global("cluster_name", node_name())
        self.sessions.start()
        self.shovels.start()
        self.federation.start()
        log.info("lavinpy started (data dir %s, fsync %s, %s codec)", config.data_dir, config.fsync,
                 "compiled" if accel.COMPILED else "pure-Python")

    async def _start_mqtt(self) -> None:
        """The MQTT listeners, plain and over TLS; a port in use stops the start as AMQP's does.

        With no MQTT listener (``mqtt_enabled``) the MQTT face is not loaded at all (its modules were
        about 1 MiB of an AMQP-only broker's RSS): stored MQTT state, delayed wills and retained
        messages, waits in the vhosts' files for a start with MQTT on, as over a stop."""
        config = self.config
        if not mqtt_enabled(config):
            return
        from .mqtt.sessions import MQTTSessions
        from .mqtt.transport import MQTTProtocol

        mqtt = self.mqtt = MQTTSessions(self.broker)
        self.layers.register(mqtt)
        mqtt.resume_wills()  # delayed wills a stop or a crash left wait again
        ports: list[tuple[int, str, ssl.SSLContext | None]] = [(config.mqtt_port, "MQTT", None)]
        if self.tls is not None and config.mqtts_enabled:
            ports.append((config.mqtts_port, "MQTTS", self.tls.listener_context))
        for port, what, context in ports:
            if port:
                self._listeners += await serve_port(lambda header: MQTTProtocol(mqtt, header), config.bind,
                                                    port, what, self.proxy_policy, context)

    async def _start_http(self) -> None:
        """The management API and /metrics, each plain and over TLS as the ports say: bound now, the HTTP
        stack loaded by the first connection to one of them (lavinpy.http.gate)."""
        config, tls = self.config, self.tls
        ports: list[tuple[str, int, str, ProxyPolicy, ssl.SSLContext | None]] = [
            ("management", config.http_port, "HTTP", self.proxy_policy, None),
            ("metrics", config.prometheus_port, "Prometheus", NO_PROXY, None)]
        if tls is not None:
            ports += [("management", config.https_port if config.https_enabled else 0, "HTTPS", self.proxy_policy,
                       tls.listener_context),
                      ("metrics", config.prometheus_tls_port if config.prometheus_tls_enabled else 0,
                       "Prometheus TLS", NO_PROXY, tls.listener_context)]
        ports = [p for p in ports if p[1]]
        if not ports:
            return
        from .http.gate import HttpGate  # imports no aiohttp

        gate = self.http_gate = HttpGate(lambda: self._load_http({kind for kind, *_ in ports}))
        for kind, port, what, policy, context in ports:
            self._http_listeners += await serve_port(gate.factory(kind, what), config.bind, port, what, policy,
                                                     context)

    async def _load_http(self, kinds: set[str]) -> dict[str, Callable[..., asyncio.Protocol]]:
        """The HTTP stack, imported in a worker thread (the loop serves AMQP meanwhile), and the servers of
        ``kinds`` of port set up."""
        await asyncio.to_thread(_import_http)
        from .http.app import HttpServer, make_app
        from .http.metrics import make_metrics_app
        from .http.routes_federation import FEDERATION
        from .http.routes_mqtt import MQTT_SESSIONS
        from .http.routes_shovels import SHOVELS

        def management_app() -> web.Application:
            cluster_nodes = self.cluster.status if self.cluster is not None else None
            app = make_app(self.broker, self.sessions, cluster_nodes)
            app[SHOVELS] = self.shovels
            app[FEDERATION] = self.federation
            if self.mqtt is not None:  # else MQTT over WebSocket answers 404, as with MQTT off
                app[MQTT_SESSIONS] = self.mqtt
            return app

        apps = {"management": management_app,
                "metrics": lambda: make_metrics_app(self.broker, self.sessions, self.links)}
        makers: dict[str, Callable[..., asyncio.Protocol]] = {}
        for kind in sorted(kinds):
            server = HttpServer(apps[kind]())
            self.http_servers.append(server)
            await server.setup()
            makers[kind] = server.protocol
        return makers

    async def _stop_http(self) -> None:
        for listener in self._http_listeners:
            listener.close()
        self._http_listeners = []
        gate, self.http_gate = self.http_gate, None
        if gate is not None:
            await gate.close()
        for server in self.http_servers:
            await server.stop()
        self.http_servers = []

    def _close_listeners(self) -> None:
        for listener in self._listeners:
            listener.close()
        self._listeners = []

    def reload_tls(self) -> None:
        """SIGHUP: read the certificate files again; new connections use them."""
        if self.tls is None:
            log.info("SIGHUP: no TLS listener (AMQPS, HTTPS, Prometheus TLS), nothing to reload")
            return
        try:
            self.tls.reload()
        except OSError as e:
            log.error("SIGHUP: TLS certificates not reloaded, the old ones stay in use: %s", e)
            return
        log.info("SIGHUP: TLS certificates reloaded from %s", self.config.tls_cert)

    async def stop(self) -> None:
        """Stop accepting, close clients with 320, flush, write indexes, release the lock."""
        log.info("stopping")
        await self.shovels.stop()
        await self.federation.stop()
        self._close_listeners()
        await self._stop_http()
        if self.mqtt is not None:
            self.mqtt.shutdown()
        sessions = self.sessions
        for conn in list(sessions.connections):
            conn.shutdown()
        # Let close frames go out and clients answer close-ok.
        deadline = asyncio.get_running_loop().time() + 2.0
        while sessions.connections and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        for conn in list(sessions.connections):
            conn.abort()
        sessions.run_pending()  # the sockets close now; their teardown runs on the next turn
        await asyncio.sleep(0)
        for vhost in self.broker.vhosts.values():
            await vhost.store.flush()
        sessions.close()
        self.broker.close()
        log.info("stopped")
        self.stopped.set()


async def serve_clustered(config: Config) -> int:
    """One node of a cluster: the broker runs only while this node leads (see cluster/node.py)."""
    from .cluster.node import ClusterNode

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    systemd = Notifier()

    def stopping() -> None:
        systemd.stopping()  # now: leaving the cluster may take a while
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping)
    loop.add_signal_handler(signal.SIGUSR1, reopen_log_file)

    async def start_leader(node: ClusterNode) -> Server:
        server = Server(config, cluster=node)
        try:
            await server.start()
        except BaseException:
            if server.broker.users is not None:  # opened (and the data dir locked) before the failure
                server.broker.close()
            raise
        loop.add_signal_handler(signal.SIGHUP, server.reload_tls)
        return server

    node = ClusterNode(config, start_leader, proxy_refused=log_bad_proxy_header)
    ready = loop.create_task(_notify_when_forwarding(node, systemd)) if systemd.enabled else None
    try:
        return await node.run(stop)
    finally:
        if ready is not None:
            ready.cancel()
        systemd.stop_watchdog()


async def _notify_when_forwarding(node: ClusterNode, systemd: Notifier) -> None:
    """READY=1 once the node's client ports accept (every role forwards or serves from then on).

    The node has no hook for that moment, so its forwarding ports are watched; a node that never joins
    etcd never reports ready, and systemd's start timeout says so.
    """
    while not node.follower_ports.listening:
        await asyncio.sleep(0.1)
    systemd.ready()
    systemd.start_watchdog()


async def serve(config: Config) -> int:
    if config.clustering:
        return await serve_clustered(config)
    server = Server(config)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    # Installed before the listeners open: a SIGTERM that arrives as soon as a port answers still
    # stops the server cleanly once it has started.
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, reopen_log_file)
    systemd = Notifier()
    try:
        await server.start()
    except DataDirLocked as e:
        log.error("%s", e)
        return 1
    except LoadDefinitionsError as e:
        log.error("cannot start: %s", e)
        server.broker.close()
        return 1
    except OSError as e:
        log.error("cannot start: %s", e)
        if server.broker.users is not None:  # opened (and the data dir locked) before the failure
            server.broker.close()
        return 1
    loop.add_signal_handler(signal.SIGHUP, server.reload_tls)
    systemd.ready()  # every listener accepts now
    systemd.start_watchdog()
    await stop.wait()
    systemd.stopping()
    await server.stop()
    systemd.stop_watchdog()
    return 0


def _import_http() -> None:
    """The HTTP stack's modules (run in a worker thread: importing aiohttp and the routes takes a few hundred ms)."""
    import importlib

    for module in ("lavinpy.http.app", "lavinpy.http.metrics"):
        importlib.import_module(module)


def mqtt_enabled(config: Config) -> bool:
    """Whether the broker listens for MQTT: on the plain port, or on the TLS one (configured with TLS)."""
    return bool(config.mqtt_port or config.mqtts_enabled)


def tune_malloc() -> bool:
    """Set glibc's malloc thresholds (see MALLOC_MMAP_THRESHOLD); False where there is no mallopt."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD))


def run(config: Config) -> int:
    gc.set_threshold(*GC_THRESHOLDS)
    tune_malloc()
    try:
        configure_logging(config.log_level, config.log_format, config.log_file)
    except OSError as e:
        print(f"lavinpy: cannot open log file {config.log_file}: {e.strerror}", file=sys.stderr)
        return 1
    try:
        import uvloop
    except ImportError:
        return asyncio.run(serve(config))
    return uvloop.run(serve(config))

FEDERATION_KEYS = {"federation-upstream", "federation-upstream-set"}


def federation_of(broker: Broker, default_user: str, local: LocalNode) -> Federation:
    """The node's federation links (lavinpy.federation), told what the model knows: the exchanges a
    federation policy matches, their bindings, the cluster name and the rights of an upstream's creator;
    its links log in to this node as a shovel does (``local``), and run on the leader only."""
    federation = Federation(local.url, node_name())

    def federated() -> dict[tuple[str, str, str], Mapping[str, Any]]:
        found: dict[tuple[str, str, str], Mapping[str, Any]] = {}
        for vhost in list(broker.vhosts.values()):
            if not any(FEDERATION_KEYS & p.definition.keys() for p in vhost.policies.list()):
                continue
            for name, exchange in vhost.exchanges.items():
                policy = vhost.policies.match(name, "exchange") if name else None
                if (policy is not None and FEDERATION_KEYS & policy.definition.keys()
                        and exchange.arguments.get("x-internal-purpose") != "federation"):
                    found[("exchange", vhost.name, name)] = policy.definition
            for name, queue in vhost.queues.items():
                policy = vhost.policies.match(name, "queue", queue_type_of(queue.arguments))
                if (policy is not None and FEDERATION_KEYS & policy.definition.keys()
                        and queue.arguments.get("x-internal-purpose") != "federation"):
                    found[("queue", vhost.name, name)] = policy.definition
        return found

    def queue_state(vhost_name: str, name: str) -> tuple[int, int] | None:
        vhost = broker.vhosts.get(vhost_name)
        q = vhost.queues.get(name) if vhost is not None else None
        return (q.consumer_count, q.message_count) if q is not None else None

    def exchange_info(vhost_name: str, name: str) -> dict[str, Any] | None:
        vhost = broker.vhosts.get(vhost_name)
        x = vhost.exchanges.get(name) if vhost is not None else None
        if x is None:
            return None
        return {"type": x.type, "durable": x.durable, "auto_delete": x.auto_delete, "internal": x.internal,
                "arguments": dict(x.arguments)}

    def bindings(vhost_name: str, name: str) -> list[tuple[str, dict[str, Any]]]:
        vhost = broker.vhosts.get(vhost_name)
        x = vhost.exchanges.get(name) if vhost is not None else None
        return [(b.routing_key, dict(b.arguments or {})) for b in x.bindings()] if x is not None else []

    def refusal(vhost: str, upstream: str, kind: str, name: str) -> str | None:  # the creator's rights, each start
        if broker.users is None:
            return None
        return LimitsOperations(broker).link_refusal(UPSTREAM, vhost, upstream, (kind, name))

    def creator(vhost: str, name: str) -> str:
        return broker.parameters.user_of(UPSTREAM, vhost, name) or default_user

    federation.federated, federation.exchange_info, federation.bindings = federated, exchange_info, bindings
    federation.queue_state = queue_state
    federation.cluster_name = lambda: broker.parameters.get_global("cluster_name") or node_name()
    federation.authorize = refusal
    broker.parameters.register(UpstreamComponent(federation, creator))
    broker.parameters.register(UpstreamSetComponent(federation))
    return federation
