"""A channel's publisher confirms and transactions (mixin for Channel).

Confirms go out once per input batch (``send_confirms``), after the fsync that persistent messages
need; a queue of (upto, flush) entries, drained by the flushes' callbacks, keeps them in order. In
tx mode publishes and acks wait for tx.commit.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque
from typing import TYPE_CHECKING

from pamqp import commands

from ..wire import writer
from ..wire.constants import PRECONDITION_FAILED
from ..wire.errors import AMQPChannelError
from .content import PendingPublish, release_bodies

if TYPE_CHECKING:
    from ..broker.vhost import VHost
    from .connection import AMQPConnection
    from .unacked import Unacked

log = logging.getLogger("lavinpy.channel")


class ConfirmsAndTx:
    conn: AMQPConnection
    id: int
    vhost: VHost
    closing: bool
    unacked: OrderedDict[int, Unacked]

    def init_confirms(self) -> None:
        self.confirm = False
        self.publish_seq = 0
        self._confirm_sent = 0
        self._confirm_upto = 0
        self._confirm_needs_sync = False
        self._confirm_waits: deque[tuple[int, asyncio.Future[None] | None]] = deque()  # (upto, flush)
        self._nacks: list[int] = []  # publish seqs refused by a reject-publish queue (rare)
        self.tx = False
        self._tx_publishes: list[PendingPublish] = []
        self._tx_settles: list[tuple[list[tuple[int, Unacked]], bool | None]] = []

    def note_published(self, count: int, needs_sync: bool) -> None:
        """``count`` publishes were routed and stored; their confirms go out with the next batch."""
        if not self.confirm:
            return
        self.publish_seq += count
        self._confirm_upto = self.publish_seq
        if needs_sync:
            self._confirm_needs_sync = True
        self.conn.confirms_pending.add(self)

    def send_confirms(self) -> None:
        """Called once per batch of input: confirm what was published, after the fsync it needs."""
        upto = self._confirm_upto
        if self.closing:
            return  # nothing may follow channel.close / close-ok on this channel
        needs_sync, self._confirm_needs_sync = self._confirm_needs_sync, False
        waits = self._confirm_waits
        if upto <= (waits[-1][0] if waits else self._confirm_sent):
            return
        if not needs_sync and not waits:
            self._send_ack(upto)
            return
        # In order after the batches still waiting, but these messages join the group commit now, not
        # once the earlier confirms went out (a replicated flush is acknowledged later than the next
        # one can start). A callback, not a task: the confirm goes out in the loop turn the flush ends.
        durable = self.vhost.store.durable(acks=False) if needs_sync else None  # messages, not acks
        waits.append((upto, durable))
        if durable is None or durable.done():
            self._confirms_ready()
        else:
            durable.add_done_callback(self._confirms_ready)

    def _confirms_ready(self, _done: asyncio.Future[None] | None = None) -> None:
        """Send the confirms of the leading batches whose flush is done, in order."""
        waits = self._confirm_waits
        while waits:
            upto, durable = waits[0]
            if durable is not None and not durable.done():
                return
            waits.popleft()
            if self.closing:
                continue
            failed = durable is not None and (durable.cancelled() or durable.exception() is not None)
            if failed:  # not known to be on disk: the publisher must not count on it (RabbitMQ nacks)
                log.error("channel %d: confirms up to %d refused: the flush failed (%s)", self.id, upto,
                          "cancelled" if durable.cancelled() else durable.exception())
                self._send_nack_upto(upto)
            else:
                self._send_ack(upto)

    def _send_nack_upto(self, upto: int) -> None:
        if upto <= self._confirm_sent:
            return
        self._nacks = [seq for seq in self._nacks if seq > upto]
        self._confirm_sent = upto
        self.send_method(commands.Basic.Nack(delivery_tag=upto, multiple=True, requeue=False))

    def _send_ack(self, upto: int) -> None:
        if upto <= self._confirm_sent:
            return
        self.vhost.stats.confirm += upto - self._confirm_sent
        if self._nacks:
            self._send_confirm_runs(upto)
            return
        multiple = upto - self._confirm_sent > 1
        self._confirm_sent = upto
        self.conn.send(writer.basic_ack(self.id, upto, multiple))

    def _send_confirm_runs(self, upto: int) -> None:
        """Confirms up to ``upto`` with refused publishes among them: acks in runs, a nack for each refusal."""
        nacks = self._nacks
        sent = self._confirm_sent
        while nacks and nacks[0] <= upto:
            seq = nacks.pop(0)
            if seq - 1 > sent:
                self.conn.send(writer.basic_ack(self.id, seq - 1, seq - 1 - sent > 1))
            self.send_method(commands.Basic.Nack(delivery_tag=seq, multiple=False, requeue=False))
            sent = seq
        if upto > sent:
            self.conn.send(writer.basic_ack(self.id, upto, upto - sent > 1))
        self._confirm_sent = upto


    def on_confirm_select(self, m: commands.Confirm.Select) -> None:
        if self.tx:
            raise AMQPChannelError(PRECONDITION_FAILED, "cannot switch from tx to confirm mode", 85, 10)
        self.confirm = True
        if not m.nowait:
            self.send_method(commands.Confirm.SelectOk())

    def on_tx_select(self, m: commands.Tx.Select) -> None:
        if self.confirm:
            raise AMQPChannelError(PRECONDITION_FAILED, "cannot switch from confirm to tx mode", 90, 10)
        self.tx = True
        self.send_method(commands.Tx.SelectOk())

    def on_tx_commit(self, m: commands.Tx.Commit) -> None:
        if not self.tx:
            raise AMQPChannelError(PRECONDITION_FAILED, "channel is not transactional", 90, 20)
        publishes, self._tx_publishes = self._tx_publishes, []
        settles, self._tx_settles = self._tx_settles, []
        needs_sync = False
        try:
            for p in publishes:
                needs_sync |= bool(self._route(self.vhost.get_exchange(p.exchange), p.routing_key,
                                               p.mandatory, p.properties, p.body.read()))
                p.body.release()
        finally:
            release_bodies(publishes)
        for items, settle in settles:
            self._settle(items, settle)
        if needs_sync:
            asyncio.get_running_loop().create_task(self._commit_after_flush())
        else:
            self.send_method(commands.Tx.CommitOk())

    async def _commit_after_flush(self) -> None:
        await self.vhost.store.flush()
        if not self.closing:
            self.send_method(commands.Tx.CommitOk())

    def on_tx_rollback(self, m: commands.Tx.Rollback) -> None:
        if not self.tx:
            raise AMQPChannelError(PRECONDITION_FAILED, "channel is not transactional", 90, 30)
        release_bodies(self._tx_publishes)
        self._tx_publishes = []
        self._restore_tx_settles()
        self.send_method(commands.Tx.RollbackOk())

    def _restore_tx_settles(self) -> None:
        """Acks taken inside a rolled-back transaction: the deliveries are unacked again."""
        restored = [pair for items, _ in self._tx_settles for pair in items]
        self._tx_settles = []
        if restored:
            merged = sorted([*self.unacked.items(), *restored])
            self.unacked = OrderedDict(merged)
