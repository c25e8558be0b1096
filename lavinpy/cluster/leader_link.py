"""A follower's link to its leader: the replication stream, which also tells whether the leader lives.

The link is lost when the connection ends and cannot be made again; the node revokes the leader's
lease once the link has been lost for ``revoke_after`` seconds (and it may lead). Without the
replication modules the link is a TCP connect to the leader's AMQP port every 0.25 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from .errors import ReplicationRefused
from .keys import NodeInfo, uri_host_port

if TYPE_CHECKING:
    from .node import ClusterNode

try:
    from .replication_client import ReplicationClient
except ModuleNotFoundError as e:
    if e.name != f"{__package__}.replication_client":
        raise
    ReplicationClient = None  # type: ignore[assignment,misc]

log = logging.getLogger("lavinpy.cluster")

REVOKE_AFTER = 1.0  # seconds without a link before the leader's lease is revoked
NEW_LEADER_GRACE = 2.0  # a just-elected leader gets this long to open its port first
STABLE = 0.5  # a connection that lasts this long counts as re-established
RETRY = 0.2
PROBE_INTERVAL = 0.25


class LeaderLink:
    def __init__(self, node: ClusterNode, leader: NodeInfo, lease: int) -> None:
        self.node = node
        self.leader = leader
        self.lease = lease  # the leader's lease: its term
        self.revoke_after = REVOKE_AFTER
        self.refused = False
        self._loop = asyncio.get_running_loop()
        self._good_at = self._loop.time() + NEW_LEADER_GRACE  # the last time the link was known up
        self._up_since: float | None = None
        self._client = None
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._replicate() if ReplicationClient is not None else self._probe())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._client is not None:
            await self._client.close()  # everything received is fsynced on return
            self._client = None

    def lost_for(self) -> float:
        """Seconds the link has been down (0 while up); a refused follower never counts as lost."""
        now = self._loop.time()
        if self.refused:
            return 0.0
        if self._up_since is not None and now - self._up_since >= STABLE:
            self._good_at = now
        return max(0.0, now - self._good_at)

    def _ended(self, started: float) -> None:
        now = self._loop.time()
        if now - started >= STABLE:
            self._good_at = now
        self._up_since = None

    async def _replicate(self) -> None:
        host, port = uri_host_port(self.leader.uri)
        node = self.node
        while True:
            client = self._client = ReplicationClient(node.data_dir, node.secret, node.id, host, port)
            started = self._up_since = self._loop.time()
            try:
                await client.run()
            except ReplicationRefused as e:
                # Not the leader's fault: never a reason to take its lease.
                self.refused = True
                log.error("cluster: leader %s refused replication: %s", self.leader.id, e)
            except Exception as e:  # the connection broke or could not be made: try again
                log.debug("cluster: replication connection to %s ended: %r", self.leader.uri, e)
            finally:
                self._ended(started)
                await client.close()
                self._client = None
            await asyncio.sleep(RETRY if not self.refused else 5.0)

    async def _probe(self) -> None:
        host, port = uri_host_port(f"tcp://{self.leader.amqp}")
        while True:
            started = self._loop.time()
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), PROBE_INTERVAL * 2)
                writer.close()
                self._good_at = max(self._good_at, started)
            except (OSError, TimeoutError):
                pass
            await asyncio.sleep(PROBE_INTERVAL)
