"""A round of deliveries in one compiled call (``_cwire.deliver_round``) and its pure twin
(``delivery_round.deliver_round_py``) give the same bytes on every connection, the same books (every run
of every channel's ``UnackedBook``: tags, positions, settled marks, ownership), the same tags, output
counts and schedules, and the same counters: rounds of one and of several messages a consumer, redelivered
flags, runs joined to a channel's last one (owned or not) up to ``OWNED_RUN_MAX``, runs that cannot join (a
settled mark, another consumer, a gap in the tags), bodies that do not fit one frame or are empty, output
past the flush size, and rounds the compiled call leaves to the twin (a no-ack consumer, another channel
kind). A hand-out of uneven picks (``consumer_set.deliver_picks``, each consumer on a channel of its own) in
the same compiled call gives what its twin, a ``Channel.deliver_run`` per stretch, gives; picks it cannot
take (two consumers on one channel, a no-ack consumer) are left to that twin. Skipped on the pure path
(nothing compiled to compare)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pamqp import commands
from session_client import Harness

from lavinpy.amqp import delivery_round
from lavinpy.broker.ops.unacked_book import OWNED_RUN_MAX
from lavinpy.broker.queues import consumer_set
from lavinpy.store.record import StoredMessage
from lavinpy.wire import accel

pytestmark = pytest.mark.skipif(not accel.COMPILED, reason="the pure-Python path is selected")

WIDTH = 6


def _message(i: int, size: int = 5) -> StoredMessage:
    body = (b"b%d-" % i * size)[:size]
    return StoredMessage(0, "" if i % 3 else "ex", "work" if i % 4 else "other", b"\x10\x00\x02", body)


class Setup:
    """A broker with ``WIDTH`` consumers on one queue (channels of their own, connections 0-2 hold two
    channels each), and the rounds' inputs built from them."""

    def __init__(self, path: Path, no_ack: bool = False, shared: bool = False) -> None:
        self.harness = harness = Harness(path)
        harness.open_client(declare=commands.Queue.Declare(queue="work"))
        self.clients = []
        for i in range(3):
            client = harness.connect()
            client.handshake()
            self.clients.append(client)
            for channel in (1, 2):
                client.open_channel(channel)
                ack_free = no_ack and i == 2 and channel == 2
                client.send((channel, commands.Basic.Consume(queue="work", consumer_tag=f"c{i}.{channel}",
                                                             no_ack=ack_free)))
                client.read()
        if shared:  # a second consumer on connection 0's channel 1
            self.clients[0].send((1, commands.Basic.Consume(queue="work", consumer_tag="c0.1b")))
            self.clients[0].read()
        self.queue = harness.broker.vhosts["/"].queues["work"]
        self.consumers = list(self.queue.consumers)
        assert len(self.consumers) == WIDTH + shared

    def state(self) -> dict[str, Any]:
        """Every connection's queued output and schedule, every channel's tags and books, the counters."""
        out: dict[str, Any] = {}
        for i, client in enumerate(self.clients):
            conn = client.conn
            out[f"conn{i}"] = (b"".join(bytes(piece) for piece in conn._out), conn._out_bytes,
                               conn._flush_scheduled, conn.send_cnt)
            for channel_id, channel in conn.channels.items():
                book = channel.deliveries.unacked
                runs = [(run.first, run.queue is self.queue, run.consumer.tag, list(run.positions), run.done,
                         run.settled, run.live, run.owned) for run in book._runs]
                out[f"book{i}.{channel_id}"] = (channel.deliveries.tag, book._head, book._count, runs)
        stats = self.queue.stats
        counters = self.clients[0].conn.channels[1].deliveries.counters
        out["counters"] = (stats.deliver, stats.redeliver, stats.deliver_no_ack, counters.deliver, counters.redeliver)
        return out

    def close(self) -> None:
        self.harness.close()


def _rounds(setup: Setup) -> list[tuple[list[Any], list[int], list[StoredMessage], list[bool] | None]]:
    consumers = setup.consumers
    rounds = []
    serial = 0

    def add(picked: list[Any], count: int, flags: bool, size: int = 5) -> None:
        nonlocal serial
        positions = [1000 + serial + i for i in range(count)]
        messages = [_message(serial + i, size) for i in range(count)]
        redelivered = [bool((serial + i) % 3 == 0) for i in range(count)] if flags else None
        serial += count
        rounds.append((picked, positions, messages, redelivered))

    add(consumers, WIDTH, False)  # one message each
    add(consumers, 4 * WIDTH + 3, True)  # whole rounds and a part of one, some redelivered
    add(consumers, 3 * WIDTH, False)  # joins each channel's last run (owned or not)
    add(consumers[::-1], WIDTH, False)  # another order
    add(consumers[:3], 3 * 7, True)
    add(consumers, 2 * WIDTH, False, size=0)  # empty bodies: the fallback frames
    add(consumers, WIDTH, False, size=200_000)  # bodies past frame_max, and output past the flush size
    add(consumers, OWNED_RUN_MAX * WIDTH // 2, False)  # joined runs past half OWNED_RUN_MAX ...
    add(consumers, OWNED_RUN_MAX * WIDTH // 2, False)  # ... that this round's would take past it: new runs
    add(consumers, 2 * WIDTH + 1, True)
    return rounds


def _uneven(setup: Setup) -> list[tuple[list[Any], list[int], list[StoredMessage], list[bool] | None]]:
    """Hand-outs of uneven picks, as the consumers' differing room gives them (``consumer_set._sweeps``), and
    picks in any order; among them whole rounds (the round's call without picks)."""
    c = setup.consumers
    rounds = []
    serial = 0

    def add(picks: list[Any], flags: bool, size: int = 5) -> None:
        nonlocal serial
        count = len(picks)
        positions = [1000 + serial + i for i in range(count)]
        messages = [_message(serial + i, size) for i in range(count)]
        redelivered = [bool((serial + i) % 3 == 0) for i in range(count)] if flags else None
        serial += count
        rounds.append((picks, positions, messages, redelivered))

    def swept(rooms: list[int], limit: int) -> list[Any]:
        return consumer_set._sweeps(list(c[:len(rooms)]), rooms, limit)[0]

    add(swept([1, 3, 2, 5, 1, 4], 40), True)  # every room used up: uneven shares
    add(swept([2, 9, 1, 4, 3, 7], 17), False)  # the limit before the rooms
    add([c[0], c[1], c[0], c[2], c[1], c[0], c[3]], True)  # any order: a share's picks apart
    add([c[5], c[4], c[5], c[5], c[3], c[2], c[1], c[0], c[0]], False)
    add(swept([4, 4, 4, 4, 4, 4], 15), True)  # whole rounds and a part of one: the round's call
    add([c[1], c[2], c[1]] * 3, False, size=0)  # empty bodies
    add([c[2], c[3], c[3]], False, size=200_000)  # bodies past frame_max, output past the flush size
    add([c[0], c[4]] + [c[4], c[0], c[0]] * (OWNED_RUN_MAX // 4), False)  # joined runs up to the cap, then new
    add(c[:WIDTH] + [c[-1], c[1], c[-1], c[3]], True)  # the extra consumer (if any) with another on its channel
    return rounds


def _by_picks(setup: Setup, picks: list[Any], positions: list[int], messages: list[Any],
              redelivered: list[bool] | None) -> Any:
    """A hand-out of any picks (``consumer_set.deliver_picks``): what comes back and the state after it."""
    return consumer_set.deliver_picks(picks, positions, messages, redelivered), setup.state()


def _by_round(setup: Setup, picked: list[Any], positions: list[int], messages: list[Any],
              redelivered: list[bool] | None) -> Any:
    """A round handed out in one ``deliver_round`` call: what comes back and the state after it."""
    return delivery_round.deliver_round(picked, positions, messages, redelivered), setup.state()


def _by_runs(setup: Setup, picked: list[Any], positions: list[int], messages: list[Any],
             redelivered: list[bool] | None) -> Any:
    """A round handed out as ``consumer_set._deliver_stretches`` does for uneven picks: one
    ``Channel.deliver_run`` per consumer's stretch (consumer ``j`` takes the next ``1 + j % 4``
    messages: stretches of 1 to 4)."""
    start = 0
    for j, consumer in enumerate(picked * len(positions)):
        if start >= len(positions):
            break
        end = min(len(positions), start + 1 + j % 4)
        flags = None if redelivered is None else redelivered[start:end]
        consumer.channel.deliver_run(consumer, positions[start:end], messages[start:end], flags)
        start = end
    return setup.state()


def _drive(path: Path, compiled: bool, monkeypatch: pytest.MonkeyPatch, no_ack: bool = False,
           hand_out: Callable[..., Any] = _by_round, rounds: Callable[[Setup], list[Any]] = _rounds,
           shared: bool = False) -> tuple[list[Any], list[Any]]:
    """The rounds handed out by ``hand_out``, the compiled round counted (or taken away: the twin)."""
    setup = Setup(path, no_ack, shared)
    calls: list[Any] = []
    compiled_round = delivery_round._round
    assert compiled_round is not None

    def counted(*args: Any) -> Any:
        result = compiled_round(*args)
        calls.append(result if len(args) == 6 else ("picks", result))
        return result

    monkeypatch.setattr(delivery_round, "_round", counted if compiled else None)
    try:
        states = []
        for i, (picked, positions, messages, redelivered) in enumerate(rounds(setup)):
            if i == 2:  # a settled mark on one book's last run: that channel's next run cannot join it
                book = setup.clients[1].conn.channels[1].deliveries.unacked
                book.pop(next(iter(book)) + 1)
            if i == 3:  # a gap in one channel's tags: its next run cannot join either
                setup.clients[2].conn.channels[1].deliveries.tag += 1
            states.append(hand_out(setup, picked, positions, messages, redelivered))
            if i == 5:  # the output taken, as the driver would
                for client in setup.clients:
                    client.conn.data_to_send()
        return calls, states
    finally:
        monkeypatch.undo()
        setup.close()


def test_the_compiled_round_gives_the_twins_bytes_books_and_counters(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    calls, compiled = _drive(tmp_path / "c", True, monkeypatch)
    _, pure = _drive(tmp_path / "py", False, monkeypatch)
    assert calls and all(result is not None for result in calls)  # every round took the compiled call
    assert compiled == pure
    final = compiled[-1][1]
    runs = [run for key, value in final.items() if key.startswith("book") for run in value[3]]
    # what the rounds are about: joined runs (owned), new runs at the cap, a settled mark, redeliveries
    assert any(run[7] and len(run[3]) > OWNED_RUN_MAX // 2 for run in runs)
    assert any(sum(len(run[3]) > OWNED_RUN_MAX // 2 for run in value[3]) >= 2
               for key, value in final.items() if key.startswith("book"))
    assert any(run[5] for run in runs) and final["counters"][1] > 0


def test_a_round_with_a_no_ack_consumer_is_left_to_the_twin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls, compiled = _drive(tmp_path / "c", True, monkeypatch, no_ack=True)
    _, pure = _drive(tmp_path / "py", False, monkeypatch, no_ack=True)
    assert None in calls  # (the rounds without the no-ack consumer are compiled)
    assert compiled == pure
    assert any(runs for runs, _ in compiled)  # the no-ack consumer's positions come back


def test_a_channel_of_another_kind_is_left_to_the_twin(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    try:
        picked, positions, messages, redelivered = _rounds(setup)[1]
        assert delivery_round._round is not None
        assert delivery_round._round(picked, positions, messages, redelivered, object, setup.queue) is None
        assert setup.state() == Setup.state(setup) and setup.queue.stats.deliver == 0
        assert all(not client.conn._out for client in setup.clients)
    finally:
        setup.close()


@pytest.mark.parametrize("no_ack", [False, True])
def test_a_channels_run_in_the_compiled_round_gives_the_twins_bytes_books_and_counters(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_ack: bool) -> None:
    calls, compiled = _drive(tmp_path / "c", True, monkeypatch, no_ack, _by_runs)
    no_calls, pure = _drive(tmp_path / "py", False, monkeypatch, no_ack, _by_runs)
    assert len(calls) > 100 and all(result is not None for result in calls) and not no_calls
    assert compiled == pure
    final = compiled[-1]
    assert final["counters"][0] > 0 and final["counters"][1] > 0  # delivered and redelivered counted
    assert (final["counters"][2] > 0) == no_ack  # a no-ack consumer's runs stay with the twin


def test_uneven_picks_in_the_compiled_call_give_the_stretches_bytes_books_and_counters(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls, compiled = _drive(tmp_path / "c", True, monkeypatch, hand_out=_by_picks, rounds=_uneven)
    _, pure = _drive(tmp_path / "py", False, monkeypatch, hand_out=_by_picks, rounds=_uneven)
    picked = [call[1] for call in calls if isinstance(call, tuple) and call[0] == "picks"]
    assert len(picked) == 8 and all(result is not None for result in picked)  # all but the whole rounds
    assert all(result is not None for result in calls)
    assert compiled == pure
    final = compiled[-1][1]
    runs = [run for key, value in final.items() if key.startswith("book") for run in value[3]]
    assert any(run[7] and len(run[3]) > OWNED_RUN_MAX // 2 for run in runs)  # a joined run near the cap
    assert any(run[5] for run in runs) and final["counters"][1] > 0


@pytest.mark.parametrize("no_ack,shared", [(True, False), (False, True)])
def test_picks_the_compiled_call_cannot_take_are_left_to_the_stretches(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_ack: bool, shared: bool) -> None:
    calls, compiled = _drive(tmp_path / "c", True, monkeypatch, no_ack, _by_picks, _uneven, shared)
    _, pure = _drive(tmp_path / "py", False, monkeypatch, no_ack, _by_picks, _uneven, shared)
    picked = [call[1] for call in calls if isinstance(call, tuple) and call[0] == "picks"]
    assert None in picked and any(result is not None for result in picked)
    assert compiled == pure
    assert any(runs for runs, _ in compiled) == no_ack  # a no-ack consumer's positions come back
