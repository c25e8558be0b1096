"""Publisher confirms and transactions."""

from __future__ import annotations

import errno

import pika
import pytest
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from . import bodies, channel_closed, get_all, settle, uid
from .rawamqp import RawAMQP, commands
from .test_policies_alarms import inproc  # noqa: F401 - the fixture


def _confirmed_tags(c: RawAMQP, channel: int, n: int) -> tuple[list[int], list]:
    """Read basic.ack frames until tags 1..n are all confirmed; each tag must be confirmed once."""
    confirmed: list[int] = []
    others = []
    while len(confirmed) < n:
        ch, f = c.recv()
        if isinstance(f, commands.Basic.Ack):
            assert ch == channel
            if f.multiple:
                new = [t for t in range(1, f.delivery_tag + 1) if t not in confirmed]
                assert new, f"multiple ack {f.delivery_tag} confirmed nothing new"
            else:
                assert f.delivery_tag not in confirmed, f"tag {f.delivery_tag} confirmed twice"
                new = [f.delivery_tag]
            confirmed.extend(new)
        elif isinstance(f, commands.Basic.Nack):
            raise AssertionError(f"unexpected nack {f.delivery_tag}")
        else:
            others.append(f)
    return sorted(confirmed), others


def test_confirm_select_and_acks(broker):
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        c.call(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
        q = c.call(1, commands.Queue.Declare(queue="", exclusive=True), commands.Queue.DeclareOk).queue
        n = 200
        for i in range(n):
            c.publish(1, "", q, str(i).encode())
        tags, _ = _confirmed_tags(c, 1, n)
        assert tags == list(range(1, n + 1))
        ok = c.call(1, commands.Queue.Declare(queue=q, passive=True), commands.Queue.DeclareOk)
        assert ok.message_count == n


def test_confirm_of_persistent_messages_on_durable_queue(broker, clients):
    q = clients.track_queue(uid("q"))
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        c.call(1, commands.Queue.Declare(queue=q, durable=True), commands.Queue.DeclareOk)
        c.call(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
        for i in range(50):
            c.publish(1, "", q, str(i).encode(), commands.Basic.Properties(delivery_mode=2))
        tags, _ = _confirmed_tags(c, 1, 50)
        assert tags == list(range(1, 51))


def test_confirm_select_nowait(broker):
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        c.send(1, commands.Confirm.Select(nowait=True))
        c.publish(1, "amq.direct", uid("nowhere"), b"x")
        ack = c.expect(commands.Basic.Ack, 1)
        assert ack.delivery_tag == 1


def test_unroutable_is_confirmed_and_mandatory_returned_first(broker):
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        c.call(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
        c.publish(1, "amq.direct", uid("nowhere"), b"plain")
        ack = c.expect(commands.Basic.Ack, 1)
        assert ack.delivery_tag == 1
        c.publish(1, "amq.direct", uid("nowhere"), b"mandatory", mandatory=True)
        ret = c.expect(commands.Basic.Return, 1)
        assert (ret.reply_code, ret.reply_text) == (312, "NO_ROUTE")
        c.expect(ContentHeader, 1)
        assert c.expect(ContentBody, 1).value == b"mandatory"
        ack = c.expect(commands.Basic.Ack, 1)
        assert ack.delivery_tag == 2


def test_pika_confirm_delivery(clients):
    conn, ch = clients.channel()
    ch.confirm_delivery()
    q = ch.queue_declare(uid("q"), exclusive=True).method.queue
    for i in range(20):
        ch.basic_publish("", q, str(i).encode())
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("amq.direct", uid("nowhere"), b"x", mandatory=True)
    assert len(get_all(ch, q)) == 20


def test_tx_then_confirm_is_406(clients):
    conn, ch = clients.channel()
    ch.tx_select()
    with channel_closed(406, "cannot switch from tx to confirm mode"):
        ch.confirm_delivery()


def test_confirm_then_tx_is_406(clients):
    conn, ch = clients.channel()
    ch.confirm_delivery()
    with channel_closed(406, "cannot switch from confirm to tx mode"):
        ch.tx_select()


def test_tx_commit_makes_publishes_visible(clients):
    conn, ch = clients.channel()
    q = ch.queue_declare(uid("q"), exclusive=True).method.queue
    watcher = conn.channel()
    ch.tx_select()
    for i in range(3):
        ch.basic_publish("", q, str(i).encode())
    settle(conn, 0.2)
    assert watcher.queue_declare(q, passive=True).method.message_count == 0
    ch.tx_commit()
    assert watcher.queue_declare(q, passive=True).method.message_count == 3
    # the next transaction starts by itself
    ch.basic_publish("", q, b"3")
    ch.tx_commit()
    assert bodies(get_all(watcher, q)) == [b"0", b"1", b"2", b"3"]


def test_tx_rollback_discards_publishes(clients):
    conn, ch = clients.channel()
    q = ch.queue_declare(uid("q"), exclusive=True).method.queue
    ch.tx_select()
    ch.basic_publish("", q, b"gone1")
    ch.basic_publish("", q, b"gone2")
    ch.tx_rollback()
    ch.basic_publish("", q, b"kept")
    ch.tx_commit()
    assert bodies(get_all(conn.channel(), q)) == [b"kept"]


def test_tx_rollback_discards_acks(clients):
    conn, ch = clients.channel()
    ch.confirm_delivery()
    q = ch.queue_declare(uid("q"), exclusive=True).method.queue
    for i in range(3):
        ch.basic_publish("", q, str(i).encode())
    c = conn.channel()
    c.tx_select()
    msgs = get_all(c, q, auto_ack=False)
    assert len(msgs) == 3
    c.basic_ack(msgs[0][0].delivery_tag)
    c.basic_ack(msgs[2][0].delivery_tag)
    c.tx_rollback()  # the acks are forgotten: all three are still unacked
    assert ch.queue_declare(q, passive=True).method.message_count == 0
    c.basic_ack(msgs[1][0].delivery_tag)
    c.tx_commit()
    c.close()  # 0 and 2 were never acked: they go back
    back = get_all(ch, q)
    assert bodies(back) == [b"0", b"2"]
    assert all(m.redelivered for m, _, _ in back)


def test_tx_commit_applies_acks(clients):
    conn, ch = clients.channel()
    ch.confirm_delivery()
    q = ch.queue_declare(uid("q"), exclusive=True).method.queue
    for i in range(3):
        ch.basic_publish("", q, str(i).encode())
    c = conn.channel()
    c.tx_select()
    get_all(c, q, auto_ack=False)
    c.basic_ack(3, multiple=True)
    c.tx_commit()
    c.close()
    assert get_all(ch, q) == []


@pytest.mark.parametrize("method", ["commit", "rollback"])
def test_tx_without_select_is_406(clients, method):
    conn, ch = clients.channel()
    with channel_closed(406, "channel is not transactional"):
        getattr(ch, f"tx_{method}")()


def test_tx_mandatory_return_on_commit(broker):
    with RawAMQP(broker.host, broker.port) as c:
        c.handshake()
        c.open_channel(1)
        c.call(1, commands.Tx.Select(), commands.Tx.SelectOk)
        c.publish(1, "amq.direct", uid("nowhere"), b"m", mandatory=True)
        c.send(1, commands.Tx.Commit())
        seen = []
        while "commit-ok" not in seen:
            _, f = c.recv()
            if isinstance(f, commands.Basic.Return):
                assert f.reply_code == 312
                seen.append("return")
            elif isinstance(f, commands.Tx.CommitOk):
                seen.append("commit-ok")
        assert seen == ["return", "commit-ok"]


@pytest.mark.timeout(60)
def test_a_failed_flush_nacks_its_publishes_and_the_channel_goes_on(inproc) -> None:  # noqa: F811 - the fixture
    """Publishes whose fsync failed are not confirmed as on disk: the publisher gets basic.nack for
    them (as RabbitMQ nacks what it cannot take responsibility for); later publishes are acked."""
    b = inproc()
    store = b.call(lambda: b.broker.vhosts["/"].store)
    queue = uid("flush-fails")

    def failing_sync(ranges, fds) -> None:  # noqa: ANN001 - the store's worker-thread signature
        raise OSError(errno.EIO, "Input/output error (injected)")

    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(queue, durable=True)
        store._sync = failing_sync  # the disk fails under the store, for this publish only
        store.fsyncs_on_loop = False  # every flush through the worker thread's _sync while it fails
        try:
            with pytest.raises(pika.exceptions.NackError):
                ch.basic_publish("", queue, b"lost?", pika.BasicProperties(delivery_mode=2))
        finally:
            del store._sync
            store.fsyncs_on_loop = True
        ch.basic_publish("", queue, b"kept", pika.BasicProperties(delivery_mode=2))  # acked: no error
        assert ch.is_open
    finally:
        conn.close()


@pytest.mark.timeout(60)
def test_a_failed_flush_closes_the_channel_of_tx_commit_and_a_new_one_commits(inproc) -> None:  # noqa: F811
    """tx.commit whose fsync failed is answered, never left waiting: channel.close 506 naming the
    failure; the client opens a channel and commits again."""
    b = inproc()
    store = b.call(lambda: b.broker.vhosts["/"].store)
    queue = uid("tx-flush-fails")

    def failing_sync(ranges, fds, directories, paths) -> None:  # noqa: ANN001 - the store's worker-thread signature
        raise OSError(errno.EIO, "Input/output error (injected)")

    conn = pika.BlockingConnection(pika.URLParameters(b.url))
    try:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        ch.tx_select()
        ch.basic_publish("", queue, b"lost?", pika.BasicProperties(delivery_mode=2))
        store._sync = failing_sync
        store.fsyncs_on_loop = False  # every flush through the worker thread's _sync while it fails
        try:
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
                ch.tx_commit()
        finally:
            del store._sync
            store.fsyncs_on_loop = True
        assert closed.value.reply_code == 506
        assert closed.value.reply_text.startswith("RESOURCE_ERROR - could not write to disk or replicate: ")
        ch = conn.channel()
        ch.tx_select()
        ch.basic_publish("", queue, b"kept", pika.BasicProperties(delivery_mode=2))
        ch.tx_commit()
        assert b"kept" in bodies(get_all(ch, queue))
    finally:
        conn.close()
