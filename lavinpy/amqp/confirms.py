"""A channel's publisher confirms (``Confirms``) and transaction (``Transaction``).

Confirms go out once per input batch (``send``), after the fsync that persistent messages need: one
entry per batch in the channel's ``broker.ops.replies.ReplyQueue``, which keeps them in order and refuses
(nacks) a batch whose flush failed. In tx mode publishes and acks are held by the ``Transaction``
until tx.commit.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pamqp import commands

from ..broker.ops import REJECTED
from ..broker.ops import publish as publish_ops
from ..wire import writer
from .content import PendingPublish, release_bodies

if TYPE_CHECKING:
    from ..broker.ops import ProtocolCounters, VHost
    from ..broker.ops.replies import ReplyQueue
    from ..broker.ops.unacked_book import Unacked
    from .channel_host import ChannelHost

log = logging.getLogger("lavinpy.channel")


class Confirms:
    """Publisher confirms of one channel in confirm mode: sequence numbers, acks and nacks."""

    __slots__ = ("channel_id", "_host", "_vhost", "_counters", "_replies", "seq", "sent", "upto", "queued",
                 "needs_sync", "nacks", "stopped")

    def __init__(self, channel_id: int, host: ChannelHost, vhost: VHost, replies: ReplyQueue,
                 counters: ProtocolCounters) -> None:
        self.channel_id = channel_id
        self._host = host
        self._vhost = vhost
        self._counters = counters
        self._replies = replies  # the channel's replies after the disk: confirms in order, nacked on failure
        self.seq = 0  # publishes received in confirm mode
        self.sent = 0  # confirmed (acked or nacked) up to here
        self.upto = 0  # to confirm with the next batch
        self.queued = 0  # handed to the reply queue up to here
        self.needs_sync = False  # the next batch waits for an fsync
        self.nacks: list[int] = []  # publish seqs refused by a reject-publish queue (rare)
        self.stopped = False  # the channel closed: nothing more goes out

    @property
    def unconfirmed(self) -> int:
        return max(0, self.seq - self.sent)

    def published(self, confirm: Any) -> None:
        """One publish: ``confirm`` as the model's publish returned it (False, True: after an
        fsync, or REJECTED: a nack)."""
        seq = self.seq = self.seq + 1
        self.upto = seq
        if confirm:
            if confirm is REJECTED:
                self.nacks.append(seq)
            else:
                self.needs_sync = True

    def published_run(self, count: int, needs_sync: bool) -> None:
        """``count`` publishes were routed and stored; their confirms go out with the next batch."""
        self.seq += count
        self.upto = self.seq
        if needs_sync:
            self.needs_sync = True

    def send(self) -> None:
        """Called once per batch of input: confirm what was published, after the fsync it needs."""
        upto = self.upto
        if self.stopped:
            return  # nothing may follow channel.close / close-ok on this channel
        needs_sync, self.needs_sync = self.needs_sync, False
        if upto <= max(self.queued, self.sent):
            return
        self.queued = upto
        # Messages only (acks=False): these messages join the group commit now, whatever waits before.
        self._replies.confirm(self._vhost.durable(acks=False) if needs_sync else None, upto)

    def refuse(self, upto: int, reason: str) -> None:
        """The flush of the publishes up to ``upto`` failed: not known to be on disk, the publisher
        must not count on them (RabbitMQ nacks)."""
        log.error("channel %d: confirms up to %d refused: %s", self.channel_id, upto, reason)
        self._send_nack_upto(upto)

    def _send_method(self, method: Any) -> None:
        self._host.send(writer.method_frame(self.channel_id, method))

    def _send_nack_upto(self, upto: int) -> None:
        if upto <= self.sent:
            return
        self.nacks = [seq for seq in self.nacks if seq > upto]
        self.sent = upto
        self._send_method(commands.Basic.Nack(delivery_tag=upto, multiple=True, requeue=False))

    def send_ack(self, upto: int) -> None:
        if upto <= self.sent:
            return
        publish_ops.confirmed(self._vhost, upto - self.sent, self._counters)
        if self.nacks:
            self._send_runs(upto)
            return
        multiple = upto - self.sent > 1
        self.sent = upto
        self._host.send(writer.basic_ack(self.channel_id, upto, multiple))

    def _send_runs(self, upto: int) -> None:
        """Confirms up to ``upto`` with refused publishes among them: acks in runs, a nack for each refusal."""
        nacks = self.nacks
        sent = self.sent
        send = self._host.send
        while nacks and nacks[0] <= upto:
            seq = nacks.pop(0)
            if seq - 1 > sent:
                send(writer.basic_ack(self.channel_id, seq - 1, seq - 1 - sent > 1))
            self._send_method(commands.Basic.Nack(delivery_tag=seq, multiple=False, requeue=False))
            sent = seq
        if upto > sent:
            send(writer.basic_ack(self.channel_id, upto, upto - sent > 1))
        self.sent = upto


Settles = list[tuple[list[tuple[int, "Unacked"]], "bool | None", bool]]


class Transaction:
    """A channel in tx mode: publishes and settles held until tx.commit, dropped by tx.rollback."""

    __slots__ = ("publishes", "settles")

    def __init__(self) -> None:
        self.publishes: list[PendingPublish] = []
        self.settles: Settles = []  # (taken deliveries, requeue and failed as for Deliveries.settle)

    @property
    def uncommitted_acks(self) -> int:
        return sum(len(items) for items, _, _ in self.settles)

    def hold_publish(self, publish: PendingPublish) -> None:
        self.publishes.append(publish)

    def hold_settle(self, items: list[tuple[int, Unacked]], requeue: bool | None, failed: bool = False) -> None:
        self.settles.append((items, requeue, failed))

    def take(self) -> tuple[list[PendingPublish], Settles]:
        """tx.commit: what the transaction held, in order; it starts over empty."""
        publishes, self.publishes = self.publishes, []
        settles, self.settles = self.settles, []
        return publishes, settles

    def rollback(self) -> list[tuple[int, Unacked]]:
        """tx.rollback (and a closing channel): held publishes dropped; returns the deliveries held
        acks had taken, to be unacked again."""
        release_bodies(self.publishes)
        self.publishes = []
        restored = [pair for items, _, _ in self.settles for pair in items]
        self.settles = []
        return restored
