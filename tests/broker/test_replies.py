"""broker.ops.replies.ReplyQueue on its own: the order of release and the failure rule of each kind, with
real futures completed out of order and a session that records what it was asked to send."""

from __future__ import annotations

import asyncio
from typing import Any

from lavinpy.broker.ops.replies import DURABILITY_FAILED, ReplyQueue


class Session:
    """A ReplySink and ConfirmSink writing down what goes out, in order."""

    def __init__(self) -> None:
        self.out: list[tuple[str, Any]] = []
        self.queue = ReplyQueue(self, self, lambda: self.out.append(("released", None)))

    def send_reply(self, reply: Any) -> None:
        self.out.append(("reply", reply))

    def durability_failed(self, reply: Any, reason: str) -> None:
        self.out.append(("closed", (reply, reason)))

    def send_confirm(self, batch: Any) -> None:
        self.out.append(("ack", batch))

    def refuse_confirm(self, batch: Any, reason: str) -> None:
        self.out.append(("nack", batch))


def test_replies_go_in_arrival_order_whatever_order_their_waits_end() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        session, first, second = Session(), loop.create_future(), loop.create_future()
        session.queue.commit(first, "declare-ok")
        session.queue.commit(second, "bind-ok")
        session.queue.follow("consume-ok")
        session.queue.commit(None, "qos-ok")
        second.set_result(None)
        await asyncio.sleep(0)
        assert session.out == [] and session.queue.waiting
        first.set_result(None)
        await asyncio.sleep(0)
        assert session.out == [("reply", "declare-ok"), ("reply", "bind-ok"), ("reply", "consume-ok"),
                               ("reply", "qos-ok"), ("released", None)]
        assert not session.queue.waiting
        session.queue.commit(None, "at once")  # nothing waits: no entry, no callback
        assert session.out[-1] == ("reply", "at once")
    asyncio.run(scenario())


def test_a_held_place_keeps_what_the_method_causes_behind_its_reply() -> None:
    session = Session()
    place = session.queue.hold()
    session.queue.follow("basic.cancel")  # sent by the method while it runs
    assert session.out == []
    session.queue.fill(place, None, "delete-ok")
    assert session.out == [("reply", "delete-ok"), ("reply", "basic.cancel"), ("released", None)]
    place = session.queue.hold()
    session.queue.fill(place, None, None)  # the method failed or has no reply (nowait)
    assert session.out[-1] == ("released", None)


def test_a_failed_wait_closes_the_session_and_drops_what_follows() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        session, flush = Session(), loop.create_future()
        session.queue.commit(flush, "commit-ok")
        session.queue.follow("channel.close 406", last=True)
        session.queue.confirm(flush, 5)
        flush.set_exception(OSError(5, "Input/output error"))
        await asyncio.sleep(0)
        [(kind, (reply, reason))] = session.out
        assert (kind, reply) == ("closed", "commit-ok")
        assert reason == f"{DURABILITY_FAILED}: [Errno 5] Input/output error"
        assert session.queue.stopped
        session.queue.commit(None, "late")
        session.queue.confirm(None, 6)
        assert len(session.out) == 1  # nothing after the close
    asyncio.run(scenario())


def test_confirms_keep_their_own_order_and_a_failed_batch_is_refused() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        session, failing, later, declare = Session(), loop.create_future(), loop.create_future(), \
            loop.create_future()
        session.queue.confirm(failing, 3)
        session.queue.confirm(later, 7)
        session.queue.commit(declare, "declare-ok")
        later.set_result(None)
        declare.set_result(None)  # a method's reply is not held back by the confirms
        await asyncio.sleep(0)
        assert session.out == [("reply", "declare-ok"), ("released", None)]
        failing.set_exception(OSError(5, "Input/output error"))
        await asyncio.sleep(0)
        assert session.out[2:] == [("nack", 3), ("ack", 7)]  # refused, and the channel goes on
        assert not session.queue.stopped
    asyncio.run(scenario())


def test_a_last_frame_stops_the_queue_once_sent() -> None:
    session = Session()
    session.queue.follow("channel.close", last=True)
    session.queue.confirm(None, 1)
    assert session.out == [("reply", "channel.close")] and session.queue.stopped


def test_a_stopped_queue_ignores_the_waits_that_end_later() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        errors: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _loop, context: errors.append(context))
        session, flush = Session(), loop.create_future()
        session.queue.commit(flush, "declare-ok")
        session.queue.confirm(flush, 1)
        session.queue.stop()  # the channel closed before its flush ended
        flush.set_result(None)
        await asyncio.sleep(0)
        assert session.out == [] and errors == []
    asyncio.run(scenario())
