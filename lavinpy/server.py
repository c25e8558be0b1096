"""Starts and stops everything: the broker, the AMQP listener, signal handling."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from .amqp.connection import AMQPConnection
from .broker.broker import Broker
from .config import Config
from .store.lock import DataDirLocked

log = logging.getLogger("lavinpy")


class Server:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.broker = Broker(config)
        self._amqp: asyncio.AbstractServer | None = None
        self.stopped = asyncio.Event()

    async def start(self) -> None:
        self.broker.open()
        loop = asyncio.get_running_loop()
        self._amqp = await loop.create_server(
            lambda: AMQPConnection(self.broker), self.config.bind, self.config.amqp_port,
            reuse_address=True, backlog=1024)
        self.broker.start()
        ports = ", ".join(str(s.getsockname()[1]) for s in self._amqp.sockets)
        log.info("lavinpy listening for AMQP on %s port %s (data dir %s, fsync %s)",
                 self.config.bind, ports, self.config.data_dir, self.config.fsync)

    async def stop(self) -> None:
        """Stop accepting, close clients with 320, flush, write indexes, release the lock."""
        log.info("stopping")
        if self._amqp is not None:
            self._amqp.close()
        connections = list(self.broker.connections)
        for conn in connections:
            conn.shutdown()
        # Let close frames go out and clients answer close-ok.
        deadline = asyncio.get_running_loop().time() + 2.0
        while self.broker.connections and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        for conn in list(self.broker.connections):
            conn.abort()
        await asyncio.sleep(0)
        for vhost in self.broker.vhosts.values():
            await vhost.store.flush()
        self.broker.close()
        log.info("stopped")
        self.stopped.set()


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


async def serve(config: Config) -> int:
    server = Server(config)
    try:
        await server.start()
    except DataDirLocked as e:
        log.error("%s", e)
        return 1
    except OSError as e:
        log.error("cannot start: %s", e)
        server.broker.close()
        return 1
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop()
    return 0


def run(config: Config) -> int:
    configure_logging(config.log_level)
    try:
        import uvloop
    except ImportError:
        return asyncio.run(serve(config))
    return uvloop.run(serve(config))
