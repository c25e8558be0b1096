"""A cluster node's roles: follower (replicating, forwarding clients) or leader (serving the broker).

etcd holds the coordination (keys in keys.py): a lease per node, the leader key bound to the leader's
lease, the in-sync replica set (ISR) written by the leader under a fence, and the shared secret.
A node campaigns only when etcd's ISR lists it and its own copy is consistent (replica_state.py), or
when an operator forces it; with no ISR in etcd only a brand-new cluster elects by itself. A leader
serves only while its lease is certainly valid: a local deadline on the monotonic clock (when the last
successful keepalive was sent + TTL, less a margin) is checked by a timer (armed again when it fires
early), every tick of the leader's guard and on the confirm and delivery paths, independently of any
etcd call; it stops at once when etcd says the lease is gone or the leader key changed. Stopping is a
re-exec of the process: every socket closes at once and the new process rejoins as a follower.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..listeners import ProxyPolicy
from ..store.lock import DataDirLock, DataDirLocked
from ..wire.proxy_header import TrustedSources
from . import replica_state, tls
from .errors import LeadershipLost
from .etcd import Compare, EtcdAuthFailed, EtcdClient, EtcdError, KeyValue, delete_op, put_op
from .files import node_id
from .follower_ports import FollowerPorts
from .keys import ClusterKeys, NodeInfo, addresses_of, isr_list, normal_address, uri_host_port
from .leader_link import LeaderLink
from .replication_server import ReplicationServer

if TYPE_CHECKING:
    from ..broker.ops import Broker
    from ..config import Config

log = logging.getLogger("lavinpy.cluster")

# Often, so that a lease whose time to live has dropped tells the others its holder has gone quiet.
KEEPALIVE_INTERVAL = 0.5
DEADLINE_MARGIN = 1.0  # a leader stops serving this long before its lease could expire
# A follower that lost its link to the leader takes the leader's lease only when etcd has not heard
# from the leader for this long either: a leader cut off from one follower alone keeps leading (and
# drops that follower from the ISR).
LEADER_SILENT = 1.5
LEADER_POLL = 0.25  # how often the leader key is read (changes are noticed within ~0.5 s)
GUARD_TICK = 0.1  # how often a leader checks its lease deadline and fence besides the timer
MEMBERS_POLL = 0.5
ETCD_RETRY = 0.5
# A leader whose key went (revoked, expired) sees it through its watch within milliseconds and stops;
# followers campaign this much later, so clients never find two nodes serving. Fencing, not this
# delay, is what keeps an old leader from confirming.
ELECTION_DELAY = 0.3


class LeaderServer(Protocol):
    """The broker with its client listeners, started by the server layer when this node leads."""

    async def stop(self) -> None: ...


StartLeader = Callable[["ClusterNode"], Awaitable[LeaderServer]]


class ClusterNode:
    def __init__(self, config: Config, start_leader: StartLeader, argv: list[str] | None = None,
                 proxy_refused: Callable[[str, object, str], None] | None = None) -> None:
        """``proxy_refused(what, peer, reason)`` logs a client refused for a PROXY header on a
        follower's port (the server passes the rate-limited log its listeners use)."""
        self.config = config
        # A follower's client ports take PROXY headers from the same trusted sources as the node's own.
        self.client_proxy_policy = ProxyPolicy(TrustedSources(config.proxy_protocol_trusted_sources),
                                               refused=proxy_refused)
        self.start_leader = start_leader
        self.argv = list(sys.argv[1:] if argv is None else argv)  # to re-exec with on stepping down
        self.data_dir = Path(config.data_dir)
        self.id = ""
        self.uri = config.clustering_uri
        self.keys = ClusterKeys(config.clustering_etcd_prefix)
        self._setup_error = ""  # a TLS file that cannot be used: run() says so and stops
        etcd_tls: ssl.SSLContext | None = None
        self.replication_tls: tuple[ssl.SSLContext, ssl.SSLContext] | None = None  # (server, client)
        try:
            etcd_tls, self.replication_tls = tls.node_contexts(config)
        except tls.ClusterTLSError as e:
            self._setup_error = str(e)
        self.etcd = EtcdClient(config.clustering_etcd_endpoints, user=config.clustering_etcd_user,
                               password=config.clustering_etcd_password, tls=etcd_tls)
        self.role = "starting"
        self.lease = 0
        self.secret = b""
        self.deadline = 0.0  # time.monotonic() by which the lease may have expired
        self._deadline_timer: asyncio.TimerHandle | None = None
        self.members: dict[str, NodeInfo] = {}  # id -> info, from <prefix>/nodes/
        self.member_addresses: set[str] = set()  # their advertised hosts, resolved
        self._members_read: asyncio.Future[None] | None = None  # the last read asked by accepts_proxy_now
        self._members_read_at = 0.0  # when it started
        self.isr: list[str] | None = None
        self.leader: NodeInfo | None = None  # followers: the leader being followed
        self.server: LeaderServer | None = None
        self.replication: ReplicationServer | None = None  # while leading
        self._lock = DataDirLock(self.data_dir / ".lock")
        self.follower_ports = FollowerPorts(config, self._leader_port, self.client_proxy_policy)
        self._link: LeaderLink | None = None
        self._tasks: list[asyncio.Task] = []
        self._fenced_out = ""  # why a fenced etcd write failed: the leader must step down
        self._refused_for = ""  # the last reason this node could not lead (logged once)
        self._epoch = 0  # while leading: the newest epoch this node's copy has recorded

    # --- life cycle -----------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> int:
        """Join the cluster and take whatever role comes, until ``stop`` is set (SIGTERM)."""
        if self._setup_error:
            log.error("cannot start: %s", self._setup_error)
            return 1
        self.id = node_id(self.data_dir)
        try:
            self._lock.acquire()  # a follower's copy is written by its replication only
        except DataDirLocked as e:
            log.error("%s", e)
            return 1
        waiting = asyncio.ensure_future(stop.wait())
        joined = asyncio.ensure_future(self._join())
        await asyncio.wait([waiting, joined], return_when=asyncio.FIRST_COMPLETED)
        if not joined.done():
            joined.cancel()
            await self._leave()
            return 0
        try:
            joined.result()
        except EtcdAuthFailed as e:
            log.error("cannot join the cluster: %s", e)
            await self._leave()
            return 1
        log.info("cluster node %s joined (uri %s, etcd %s, prefix %s)", self.id, self.uri,
                 self.config.clustering_etcd_endpoints, self.keys.prefix)
        self._tasks = [asyncio.ensure_future(self._keep_lease()), asyncio.ensure_future(self._watch_members())]
        try:
            await self.follower_ports.start()
        except OSError as e:
            log.error("cannot start: %s", e)
            await self._leave()
            return 1
        roles = asyncio.ensure_future(self._roles())
        await asyncio.wait([waiting, roles], return_when=asyncio.FIRST_COMPLETED)
        if roles.done():
            roles.result()  # only ends by raising
        roles.cancel()
        await self._leave()
        return 0

    async def _join(self) -> None:
        """The shared secret, a lease and this node's info in etcd (retried until etcd answers)."""
        attempts = 0
        while True:
            try:
                secret = self.keys.secret
                await self.etcd.put_if_absent(secret, os.urandom(32).hex())
                stored = await self.etcd.get(secret)
                if stored is None:  # deleted in between: written again on the next attempt
                    raise EtcdError(f"{secret} is gone")
                self.secret = bytes.fromhex(stored.text)
                sent = time.monotonic()
                self.lease = await self.etcd.lease_grant(self.config.clustering_lease_ttl)
                self.deadline = sent + self.config.clustering_lease_ttl
                await self.etcd.put(self.keys.node(self.id), self._info().to_json(), self.lease)
                return
            except EtcdAuthFailed:
                raise  # a setting to fix, not a state to wait out
            except EtcdError as e:
                if attempts % 30 == 0:  # once, then every 30 s
                    log.warning("cluster: waiting for etcd (%s)", e)
                attempts += 1
                await asyncio.sleep(1.0)

    def _info(self) -> NodeInfo:
        host = uri_host_port(self.uri)[0]
        http = f"{host}:{self.config.http_port}" if self.config.http_port else ""
        mqtt = f"{host}:{self.config.mqtt_port}" if self.config.mqtt_port else ""
        return NodeInfo(self.id, self.uri, f"{host}:{self.config.amqp_port}", http,
                        replica_state.read(self.data_dir) is not None, mqtt)

    async def _leave(self) -> None:
        """SIGTERM: stop serving, give up the lease (the others take over at once), release the data dir."""
        for task in self._tasks:
            task.cancel()
        if self.server is not None:
            await self.server.stop()
            self.server = None
            state = replica_state.read(self.data_dir)
            if state is not None and state.state == replica_state.UNSYNCED:
                # The clean stop synced what it wrote: the copy is consistent at the epoch it reached.
                replica_state.write(self.data_dir, replica_state.CONSISTENT, state.epoch)
        if self.replication is not None:
            await self.replication.stop()
        await self._stop_following()
        await self.follower_ports.stop()
        if self.lease:
            try:
                await self.etcd.lease_revoke(self.lease)
            except EtcdError as e:
                log.warning("cluster: lease not revoked (%s); it expires within %d s", e,
                            self.config.clustering_lease_ttl)
        await self.etcd.close()
        if self._lock.held:
            self._lock.release()

    # --- lease and members ----------------------------------------------------------------------
    async def _keep_lease(self) -> None:
        failures = 0
        while True:
            await asyncio.sleep(KEEPALIVE_INTERVAL)
            sent = time.monotonic()
            try:
                ttl = await self.etcd.lease_keepalive(self.lease)
            except EtcdError as e:
                if failures == 0:
                    log.warning("cluster: lease keepalive failed (%s); the lease runs out in %.1f s",
                                e, self.deadline - time.monotonic())
                failures += 1
                self._check_deadline()
                continue
            if ttl == 0:
                self.step_down("etcd says this node's lease is gone (expired or revoked)")
            if failures:
                log.info("cluster: lease kept alive again")
            failures = 0
            self.deadline = sent + ttl
            if self.role == "leader":
                self._arm_deadline()

    def lease_valid(self) -> bool:
        """Whether this node may still act as leader: its lease certainly has not run out. Checked by
        the confirm and delivery paths; False starts the step-down."""
        if time.monotonic() < self.deadline - DEADLINE_MARGIN:
            return True
        asyncio.get_running_loop().call_soon(self._lease_ran_out)
        return False

    def _check_deadline(self) -> None:
        """The deadline checked without the timer (each keepalive and guard tick): a timer lost or late
        does not extend a leader's term by more than a tick."""
        if self.role == "leader" and time.monotonic() >= self.deadline - DEADLINE_MARGIN:
            self._lease_ran_out()

    def _arm_deadline(self) -> None:
        """A timer at the deadline: stepping down does not wait for an etcd call to return."""
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        delay = self.deadline - DEADLINE_MARGIN - time.monotonic()
        self._deadline_timer = asyncio.get_running_loop().call_later(max(0.0, delay), self._lease_ran_out)

    def _lease_ran_out(self) -> None:
        """The deadline timer, or a check that found the deadline near: step down once it has come, else
        arm the timer again. A timer may fire before the time asked: uvloop counts whole milliseconds of
        a clock read at the start of the loop's turn, about 1 ms early in a third of the cases. A check
        that only returned then left no timer at all, and a leader cut off from etcd served on (confirms
        stalled, its ports open) past its lease, while another node was elected."""
        if self.role != "leader":
            return
        if time.monotonic() >= self.deadline - DEADLINE_MARGIN:
            self.step_down(f"etcd unreachable: the lease may expire in {self.deadline - time.monotonic():.1f} s")
        else:
            self._arm_deadline()

    async def _watch_members(self) -> None:
        while True:
            try:
                await self._refresh_members()
            except EtcdError:
                pass
            await asyncio.sleep(MEMBERS_POLL)

    async def _refresh_members(self) -> None:
        """The live nodes (whose addresses may send PROXY lines) and the ISR, for status and trust."""
        nodes = await self.etcd.get_prefix(self.keys.nodes)
        isr = await self.etcd.get(self.keys.isr)
        self.members = {info.id: info for info in map(NodeInfo.from_kv, nodes) if info is not None}
        self.isr = isr_list(isr)
        addresses: set[str] = set()
        for info in self.members.values():
            for host in info.hosts():
                addresses |= await addresses_of(host)
        self.member_addresses = addresses

    def accepts_proxy_from(self, host: str) -> bool:
        """Whether a PROXY line from ``host`` is trusted: it is a cluster member's address."""
        return normal_address(host) in self.member_addresses

    async def accepts_proxy_now(self, host: str, since: float) -> bool:
        """As ``accepts_proxy_from``, from the members read again after ``since`` (time.monotonic()):
        a follower whose lease expired registers again before it forwards, but the poll may not have
        seen it yet. One read serves every connection waiting for it; etcd's answer is linearizable,
        so a read started after the connection came sees a registration made before it."""
        while True:
            if self._members_read is None or (self._members_read.done() and self._members_read_at < since):
                self._members_read_at = time.monotonic()
                self._members_read = asyncio.ensure_future(self._refresh_members())
            read, fresh = self._members_read, self._members_read_at >= since
            try:
                await asyncio.shield(read)
            except EtcdError as e:
                if fresh:
                    log.warning("cluster: members not read again for a PROXY line from %s (%s)", host, e)
                    return self.accepts_proxy_from(host)
            if fresh:
                return self.accepts_proxy_from(host)

    # --- roles ----------------------------------------------------------------------------------
    async def _roles(self) -> None:
        """Follow whoever leads; campaign when nobody does and this node may."""
        while True:
            try:
                leader = await self.etcd.get(self.keys.leader)
                if leader is None:
                    await asyncio.sleep(ELECTION_DELAY)
                    if await self._campaign():
                        await self._lead()
                        return
                    self.leader = None
                    continue
                if leader.lease == self.lease:
                    # Our own campaign, whose answer was lost (timed out) but which etcd applied.
                    await self._lead()
                    return
                info = await self._node_of_lease(leader.lease)
                if leader.text == self.uri or (info is not None and info.id == self.id):
                    # Our previous process led and was killed: its lease outlives it. (Its node key
                    # was replaced under our new lease, so the advertised URI is what tells.)
                    log.info("cluster: the leader key is this node's from before its restart; revoking that lease")
                    await self.etcd.lease_revoke(leader.lease)
                    continue
                await self._follow(leader, info)
            except EtcdError as e:
                log.warning("cluster: etcd: %s", e)
                await asyncio.sleep(ETCD_RETRY)

    async def _node_of_lease(self, lease: int) -> NodeInfo | None:
        for kv in await self.etcd.get_prefix(self.keys.nodes):
            if kv.lease == lease:
                return NodeInfo.from_kv(kv)
        return None

    async def _may_lead(self) -> list[Compare] | None:
        """The etcd conditions under which this node may take the leader key, or None when it may not.

        Forced by an operator (``lavinpyctl force_leader``): always. Otherwise etcd's ISR must list this
        node and its copy must be consistent (not half-way through a sync, not an unsynced leader's
        after the machine restarted). With no ISR in etcd only a brand-new cluster elects by itself:
        never bootstrapped, and no live node, this one included, has ever held a copy.
        """
        forced = await self.etcd.get(self.keys.force_leader)
        if forced is not None and forced.text == self.id:
            return [Compare(self.keys.force_leader, "MOD", forced.mod_revision)]
        isr = await self.etcd.get(self.keys.isr)
        members = isr_list(isr)
        if isr is None or members is None:
            if await self.etcd.get(self.keys.bootstrapped) is not None:
                self._refuse("etcd holds no ISR for a cluster that has had one")
                return None
            veterans = sorted(i.id for i in self.members.values() if i.history) + (
                [self.id] if replica_state.read(self.data_dir) is not None else [])
            if veterans:
                self._refuse(f"etcd holds no ISR, and nodes {sorted(set(veterans))} were in a cluster before")
                return None
            return [Compare(self.keys.isr, "CREATE", 0), Compare(self.keys.bootstrapped, "CREATE", 0)]
        if self.id not in members:
            return None
        state = replica_state.read(self.data_dir)
        if state is None or not state.consistent:
            self._refuse(f"this node's copy is not consistent ({state.state if state else 'never synced'})")
            return None
        recorded = await self._recorded_epoch()
        if state.epoch < recorded:
            self._refuse(f"this node's copy holds epoch {state.epoch}, older than the {recorded} every "
                         "in-sync node held (a restored backup?)")
            return None
        # The ISR must be as read: a node dropped from it in between does not get elected.
        return [Compare(self.keys.isr, "MOD", isr.mod_revision)]

    def _refuse(self, reason: str) -> None:
        """Log once why this node may not lead; _may_lead then answers None."""
        if reason != self._refused_for:
            self._refused_for = reason
            log.warning("cluster: node %s may not lead: %s (`lavinpyctl force_leader %s` overrides)",
                        self.id, reason, self.id)

    async def _campaign(self) -> bool:
        guard = await self._may_lead()
        if guard is None:
            return False
        won = await self.etcd.txn([Compare(self.keys.leader, "CREATE", 0), *guard],
                                  [put_op(self.keys.leader, self.uri, self.lease), delete_op(self.keys.force_leader)])
        return won

    async def _follow(self, leader: KeyValue, info: NodeInfo | None) -> None:
        """Replicate from the leader and forward clients to it until the leader key changes, or until
        the leader is unreachable and this in-sync node revokes its lease (fast failover)."""
        if info is None:  # its node key may not be there yet
            await asyncio.sleep(LEADER_POLL)
            return
        if self.leader is None or self.leader.id != info.id:
            log.info("cluster: following leader %s at %s (AMQP %s)", info.id, info.uri, info.amqp)
        self.leader = info
        self.role = "follower"
        link = self._link
        if link is None or link.lease != leader.lease:  # a new term, even of the same node: a new link
            await self._stop_following()
            link = self._link = LeaderLink(self.data_dir, self.secret, self.id, info, leader.lease,
                                           self.replication_tls[1] if self.replication_tls else None)
            link.start()
        while True:
            await asyncio.sleep(LEADER_POLL)
            current = await self.etcd.get(self.keys.leader)
            if current is None or current.lease != leader.lease or current.value != leader.value:
                return
            if link.lost_for() >= link.revoke_after and link.port_closed \
                    and await self._leader_silent(leader.lease) and await self._may_lead() is not None:
                log.warning("cluster: leader %s gone for %.1f s (its replication port refuses connections) and "
                            "silent in etcd; revoking its lease to take over", info.id, link.lost_for())
                await self.etcd.lease_revoke(leader.lease)
                return

    async def _leader_silent(self, lease: int) -> bool:
        """Whether the leader has not kept its lease alive for LEADER_SILENT seconds (it keeps it
        alive every KEEPALIVE_INTERVAL): it is down, paused or cut off from etcd, not just from us."""
        remaining = await self.etcd.lease_time_to_live(lease)
        return remaining < 0 or remaining <= self.config.clustering_lease_ttl - LEADER_SILENT

    async def _stop_following(self) -> None:
        if self._link is not None:
            await self._link.stop()
            self._link = None

    async def _lead(self) -> None:
        log.info("cluster: node %s elected leader", self.id)
        self.role = "leader"
        self.leader = self._info()
        await self._stop_following()  # the replication client fsyncs what it received
        await self.follower_ports.stop()
        self._lock.release()  # the broker takes it
        self._arm_deadline()
        try:
            # Written before serving: with fsync "never" what this node writes from now on is in the
            # page cache only, which a machine crash loses (replica_state.py).
            state = replica_state.read(self.data_dir)
            self._epoch = max(state.epoch if state else 0, await self._recorded_epoch())
            await asyncio.to_thread(replica_state.write, self.data_dir, self._leading_state(), self._epoch)
            await self._refresh_members()  # the followers' proxies are trusted from the first connection
            host, port = self.config.clustering_bind, self.config.clustering_port
            self.replication = ReplicationServer(self.data_dir, self.secret, self.id, self, host, port,
                                                 self.lease_valid, self._epoch,
                                                 self.replication_tls[0] if self.replication_tls else None)
            await self.replication.start()
            self.server = await self.start_leader(self)
        except Exception as e:
            log.exception("cluster: cannot serve as leader")
            self.step_down(f"starting the broker failed: {e}")
        self._run_hook(self.config.clustering_on_leader_elected, "clustering_on_leader_elected")
        await self._guard_leadership()

    def attach(self, broker: Broker) -> None:
        """Called by the server once the broker is open, before its listeners accept."""
        broker.serving_guard = self.lease_valid
        if self.replication is not None:
            self.replication.attach(broker)

    async def _guard_leadership(self) -> None:
        """Step down when the leader key is no longer ours, a fenced write failed, or the lease deadline
        comes near (a timer, see _arm_deadline, and a check every tick). The watch reacts at once; the
        reads every 0.25 s cover a watch that broke. The reads run apart from the ticks: one read waits
        up to a second per etcd endpoint for a member that does not answer."""
        self._tasks += [asyncio.ensure_future(self._watch_leader_key()), asyncio.ensure_future(self._read_leader_key())]
        while True:
            if self._fenced_out:
                self.step_down(self._fenced_out)
            self._check_deadline()
            await asyncio.sleep(GUARD_TICK)

    async def _read_leader_key(self) -> None:
        while True:
            try:
                leader = await self.etcd.get(self.keys.leader)
            except EtcdError:
                pass  # etcd unreachable: the lease deadline decides
            else:
                if leader is None or leader.lease != self.lease or leader.text != self.uri:
                    self.step_down("the leader key is no longer this node's")
            await asyncio.sleep(LEADER_POLL)

    async def _watch_leader_key(self) -> None:
        while True:
            try:
                async for event in self.etcd.watch(self.keys.leader):
                    if event.kind == "DELETE" or event.kv.lease != self.lease or event.kv.text != self.uri:
                        self.step_down("the leader key was deleted or taken")
            except EtcdError:
                pass
            await asyncio.sleep(ETCD_RETRY)

    # --- IsrWriter (called by the replication server) -------------------------------------------
    async def write_isr(self, members: list[str], epoch: int = 0) -> None:
        """Record the in-sync replica set and the epoch they all hold, only while this node holds the
        leader key (fenced txn). Retried while etcd is unreachable (confirms wait); LeadershipLost when
        the fence fails. This node's own copy records the epoch first: etcd never claims more."""
        if epoch > self._epoch:
            await asyncio.to_thread(replica_state.write, self.data_dir, self._leading_state(), epoch)
            self._epoch = epoch
        fence = [Compare(self.keys.leader, "VALUE", self.uri), Compare(self.keys.leader, "LEASE", self.lease)]
        writes = [put_op(self.keys.isr, json.dumps(members)), put_op(self.keys.bootstrapped, self.id)]
        if epoch:
            writes.append(put_op(self.keys.isr_epoch, str(epoch)))
        while True:
            try:
                written = await self.etcd.txn(fence, writes)
            except EtcdError as e:
                log.warning("cluster: ISR %s not written yet (%s)", members, e)
                await asyncio.sleep(ETCD_RETRY)
                continue
            if not written:
                self._fenced_out = "the ISR write failed its fence: this node no longer holds the leader key"
                raise LeadershipLost(f"node {self.id} no longer holds the leader key")
            self.isr = list(members)
            return

    def _leading_state(self) -> str:
        # With fsync "never" what a leader writes is in the page cache only, which a machine crash
        # loses (replica_state.py).
        return replica_state.UNSYNCED if self.config.fsync == "never" else replica_state.CONSISTENT

    async def _recorded_epoch(self) -> int:
        kv = await self.etcd.get(self.keys.isr_epoch)
        try:
            return int(kv.text) if kv is not None else 0
        except ValueError:
            return 0

    # --- status ---------------------------------------------------------------------------------
    def status(self) -> list[dict[str, Any]]:
        """Every member with its role; per follower the replication figures when this node leads."""
        figures = {}
        if self.replication is not None:
            figures = {f["id"]: f for f in self.replication.follower_status()}
        leader_id = self.leader.id if self.leader is not None else None
        nodes = []
        for info in sorted(self.members.values(), key=lambda i: i.id):
            entry: dict[str, Any] = {"clustering_id": info.id, "self": info.id == self.id,
                                     "role": "leader" if info.id == leader_id else "follower",
                                     "clustering_uri": info.uri, "amqp_address": info.amqp,
                                     "http_address": info.http, "in_sync": self.isr is not None and info.id in self.isr}
            follower = figures.get(info.id)
            if follower is not None:
                entry.update({k: follower[k] for k in ("bytes_sent", "bytes_acked", "lag_bytes") if k in follower})
                entry["in_sync"] = bool(follower.get("in_sync", entry["in_sync"]))
            nodes.append(entry)
        return nodes

    # --- follower's client ports (follower_ports.py) ----------------------------------------------
    def _leader_port(self, which: str) -> tuple[str, int] | None:
        leader = self.leader
        if leader is None or self.role != "follower":
            return None
        address = {"amqp": leader.amqp, "http": leader.http, "mqtt": leader.mqtt}[which]
        return uri_host_port(f"tcp://{address}") if address else None

    # --- stepping down --------------------------------------------------------------------------
    def step_down(self, reason: str) -> None:
        """Stop serving now: re-exec the process, which rejoins as a follower."""
        was_leader = self.role == "leader"
        log.error("cluster: node %s stops %s: %s; restarting as a follower", self.id,
                  "leading" if was_leader else "following", reason)
        if was_leader:
            self._run_hook(self.config.clustering_on_leader_lost, "clustering_on_leader_lost")
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            os.execv(sys.executable, [sys.executable, "-m", "lavinpy", *self.argv])
        except OSError as e:  # serving on is not an option: exit, the supervisor restarts the node
            log.critical("cluster: cannot re-exec (%s); exiting", e)
            os._exit(70)

    def _run_hook(self, command: str, name: str) -> None:
        if not command:
            return
        try:
            subprocess.Popen(command, shell=True, start_new_session=True, stdin=subprocess.DEVNULL)
        except OSError as e:
            log.error("cluster: %s could not run: %s", name, e)

