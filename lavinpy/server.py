"""Starts and stops everything: the broker, the AMQP listener, signal handling."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from typing import TYPE_CHECKING, Any

from .amqp.sessions import Sessions
from .amqp.transport import AMQPProtocol
from .broker.broker import Broker
from .broker.definitions_io import DefinitionsFileError, load_definitions_file
from .config import Config
from .listeners import address_text, bind_sockets, listen
from .logs import configure_logging, reopen_log_file
from .store.lock import DataDirLocked
from .systemd_notify import Notifier
from .tls import ServerTLS
from .wire import accel

if TYPE_CHECKING:
    from .cluster.node import ClusterNode

log = logging.getLogger("lavinpy")


class Server:
    def __init__(self, config: Config, cluster: ClusterNode | None = None) -> None:
        """``cluster``: the node this server runs for as the cluster's leader (None: a single broker)."""
        self.config = config
        self.cluster = cluster
        # Cluster members forward clients after a PROXY line; nobody else may send one.
        self.accept_proxy = cluster.accepts_proxy_from if cluster is not None else None
        self.broker = Broker(config)
        self.sessions = Sessions(self.broker)
        self._listeners: list[asyncio.AbstractServer] = []
        self.tls: ServerTLS | None = None
        self.http: Any = None  # the management API server, when http_port is not 0
        self.metrics: Any = None  # the Prometheus endpoint's runner, when prometheus_port is not 0
        self.stopped = asyncio.Event()

    async def start(self) -> None:
        config = self.config
        if config.amqps_enabled:
            self.tls = ServerTLS(config)  # bad certificate files stop the start before anything is opened
        self.broker.open()
        if config.load_definitions:
            changes = load_definitions_file(self.broker, config.load_definitions)
            log.info("definitions loaded from %s: %d changes", config.load_definitions, len(changes))
        if self.cluster is not None:
            self.cluster.attach(self.broker)  # replication hooks in before any client is accepted
        try:
            self._listeners = await listen(lambda: AMQPProtocol(self.sessions, self.accept_proxy), config.bind,
                                           config.amqp_port, "AMQP")
            if self.tls is not None:
                self._listeners += await listen(lambda: AMQPProtocol(self.sessions), config.bind,
                                                config.amqps_port, "AMQPS", self.tls.listener_context)
            if config.http_port:
                await self._start_http()
            if config.prometheus_port:
                await self._start_metrics()
        except BaseException:
            self._close_listeners()
            raise
        self.broker.start()
        self.sessions.start()
        log.info("lavinpy started (data dir %s, fsync %s, %s codec)", config.data_dir, config.fsync,
                 "compiled" if accel.COMPILED else "pure-Python")

    async def _start_http(self) -> None:
        # aiohttp is imported only when the API is on: a broker without it starts without the cost.
        from .http.app import HttpServer, make_app
        sockets = bind_sockets(self.config.bind, self.config.http_port, "HTTP")
        cluster_nodes = self.cluster.status if self.cluster is not None else None
        self.http = HttpServer(make_app(self.broker, self.sessions, cluster_nodes))
        await self.http.start(sockets, self.accept_proxy)
        log.info("listening for HTTP on %s", ", ".join(address_text(s) for s in sockets))

    async def _start_metrics(self) -> None:
        from .http.metrics import start_metrics_server
        sockets = bind_sockets(self.config.bind, self.config.prometheus_port, "Prometheus")
        self.metrics = await start_metrics_server(self.broker, self.sessions, sockets)
        log.info("listening for Prometheus on %s", ", ".join(address_text(s) for s in sockets))

    def _close_listeners(self) -> None:
        for listener in self._listeners:
            listener.close()
        self._listeners = []

    def reload_tls(self) -> None:
        """SIGHUP: read the certificate files again; new connections use them."""
        if self.tls is None:
            log.info("SIGHUP: no TLS listener, nothing to reload")
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
        self._close_listeners()
        if self.http is not None:
            await self.http.stop()
            self.http = None
        if self.metrics is not None:
            await self.metrics.cleanup()
            self.metrics = None
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

    node = ClusterNode(config, start_leader)
    ready = loop.create_task(_notify_when_forwarding(node, systemd)) if systemd.enabled else None
    try:
        return await node.run(stop)
    finally:
        if ready is not None:
            ready.cancel()
        systemd.stop_watchdog()


async def _notify_when_forwarding(node: ClusterNode, systemd: Notifier) -> None:
    """READY=1 once the node's client ports accept (every role forwards or serves from then on).

    The node has no hook for that moment, so its proxies are watched; a node that never joins
    etcd never reports ready, and systemd's start timeout says so.
    """
    while not (node._proxies and all(proxy._servers for proxy in node._proxies)):
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
    except DefinitionsFileError as e:
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


def run(config: Config) -> int:
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
