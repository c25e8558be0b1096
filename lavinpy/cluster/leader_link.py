"""A follower's link to its leader: the replication stream, which also tells whether the leader lives.

The link is up only once the leader has proved the shared secret (a connect that hangs is not a
link), and lost when the connection ends and cannot be made again. The node revokes the leader's
lease early only on evidence that the leader no longer serves: the link has been lost for
``revoke_after`` seconds and the leader's host refuses connections to its replication port (a leader
process serves only while that port listens), etcd has not heard from the leader either, and this
node may lead. A timeout or an unreachable host proves nothing (a partition, a paused process): then
the lease runs out by itself, after the old leader's own deadline. Failed attempts are retried with a
growing delay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from pathlib import Path

from .errors import ReplicationRefused
from .keys import NodeInfo, uri_host_port
from .replication_client import ReplicationClient

log = logging.getLogger("lavinpy.cluster")

REVOKE_AFTER = 1.0  # seconds without a link before the leader's lease is revoked
NEW_LEADER_GRACE = 2.0  # a just-elected leader gets this long to open its port first
STABLE = 0.5  # a connection that lasts this long counts as re-established
RETRY = 0.2  # the first retry; doubled after every attempt that did not reach the stream, up to MAX_RETRY
MAX_RETRY = 5.0


class LeaderLink:
    """Replicates into ``data_dir`` as follower ``node_id`` (proving ``secret``) from ``leader`` in its term
    ``lease``."""

    def __init__(self, data_dir: Path, secret: bytes, node_id: str, leader: NodeInfo, lease: int,
                 tls: ssl.SSLContext | None = None) -> None:
        self.data_dir = data_dir
        self.tls = tls
        self.secret = secret
        self.node_id = node_id
        self.leader = leader
        self.lease = lease  # the leader's lease: its term
        self.revoke_after = REVOKE_AFTER
        self.refused = False
        self.port_closed = False  # the last attempt was refused by the leader's host: nothing listens
        self._good_at = time.monotonic() + NEW_LEADER_GRACE  # the last time the link was known up
        self._client: ReplicationClient | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._replicate())

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
        now = time.monotonic()
        if self.refused:
            return 0.0
        client = self._client
        up_since = client.up_since if client is not None else None
        if up_since is not None and now - up_since >= STABLE:
            self._good_at = now
        return max(0.0, now - self._good_at)

    async def _replicate(self) -> None:
        host, port = uri_host_port(self.leader.uri)
        retry = RETRY
        while True:
            client = self._client = ReplicationClient(self.data_dir, self.secret, self.node_id, host, port, self.tls)
            self.port_closed = False
            try:
                await client.run()
            except ReplicationRefused as e:
                # Not the leader's fault: never a reason to take its lease.
                self.refused = True
                log.error("cluster: leader %s refused replication: %s", self.leader.id, e)
            except ConnectionRefusedError:
                self.port_closed = True
            except Exception as e:  # the connection broke or could not be made: try again
                log.debug("cluster: replication connection to %s ended: %r", self.leader.uri, e)
            finally:
                await client.close()
                self._client = None
            retry = RETRY if client.streamed else min(retry * 2, MAX_RETRY)
            await asyncio.sleep(retry if not self.refused else MAX_RETRY)
