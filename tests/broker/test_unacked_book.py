"""The channel's unacked deliveries kept as runs (broker.ops.deliveries.UnackedBook) against the plain
reference they replace, an ordered dict of tag to record: random deliveries, runs, gets, acks in and
out of order, multiple acks, requeues of everything (as records or as pieces of runs) and rollbacks
give the same records in the same order, and each settling call hands back the same deliveries."""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest

from lavinpy.broker.ops.unacked_book import OWNED_RUN_MAX, Unacked, UnackedBook


def flatten(taken: list) -> list[tuple[int, Unacked]]:
    return [(first + i, Unacked(queue, pos, consumer))
            for first, (queue, consumer, positions) in taken for i, pos in enumerate(positions)]


@pytest.mark.parametrize("seed", range(40))
def test_the_runs_hold_what_an_ordered_dict_would(seed: int) -> None:
    rng = random.Random(seed)
    queues = ["q1", "q2"]
    consumers = ["c1", "c2", None]
    book = UnackedBook()
    ref: OrderedDict[int, Unacked] = OrderedDict()
    tag = 0
    pos = 1000
    for _ in range(400):
        op = rng.random()
        live = list(ref)
        if op < 0.25:  # a run to one consumer of one queue
            n = rng.randint(1, 6)
            queue, consumer = rng.choice(queues), rng.choice(consumers[:2])
            positions = list(range(pos, pos + n))
            book.add_run(tag + 1, queue, consumer, positions)  # type: ignore[arg-type]
            for i, p in enumerate(positions):
                ref[tag + 1 + i] = Unacked(queue, p, consumer)  # type: ignore[arg-type]
            tag += n
            pos += n
        elif op < 0.45:  # single deliveries (a tag now and then skipped: a no-ack delivery)
            tag += rng.choice((1, 1, 1, 2))
            queue, consumer = rng.choice(queues), rng.choice(consumers)
            book.add(tag, queue, pos, consumer)  # type: ignore[arg-type]
            ref[tag] = Unacked(queue, pos, consumer)  # type: ignore[arg-type]
            pos += 1
        elif op < 0.6 and live:  # one ack, anywhere
            t = rng.choice(live + [tag + 5])
            assert book.pop(t) == ref.pop(t, None)
        elif op < 0.72 and live:  # acks in delivery order from the oldest (or not)
            start = live[0] if rng.random() < 0.8 else rng.choice(live)
            count = rng.randint(1, 8)
            wanted = list(range(start, start + count))
            pieces = book.take_consecutive(start, count)
            if pieces is not None:
                assert wanted == list(ref)[:count]  # only the oldest, all unacked
                records = [Unacked(queue, p, consumer) for queue, consumer, positions in pieces for p in positions]
                taken = list(zip(wanted, records, strict=True))
                assert taken == [(t, ref.pop(t)) for t in wanted]
        elif op < 0.82 and live:  # basic.ack multiple
            upto = rng.choice(live + [tag + 3])
            expect = [(t, ref.pop(t)) for t in [t for t in ref if t <= upto]]
            assert flatten(book.take_upto(upto)) == expect
        elif op < 0.85:  # basic.recover / a closing channel: records, or pieces of runs
            if rng.random() < 0.5:
                assert book.take_all() == list(ref.items())
            else:
                pieces = book.take_all_pieces()
                assert [Unacked(q, p, c) for q, c, positions in pieces for p in positions] == list(ref.values())
            ref.clear()
        elif op < 0.95 and live:  # tx.rollback: settled deliveries back
            chosen = rng.sample(live, min(len(live), rng.randint(1, 4)))
            held = [(t, ref.pop(t)) for t in sorted(chosen)]
            for t, _item in held:
                assert book.pop(t) is not None
            book.restore(held)
            ref = OrderedDict(sorted([*ref.items(), *held]))
        assert len(book) == len(ref)
        assert list(book) == list(ref)
        assert list(book.items()) == list(ref.items())
        probe = rng.randint(0, tag + 2)
        assert book.get(probe) == ref.get(probe) and (probe in book) == (probe in ref)
    assert book == dict(ref)


def test_acks_in_order_take_whole_slices_of_the_runs() -> None:
    book = UnackedBook()
    book.add_run(1, "q", "c", [10, 11, 12])  # type: ignore[arg-type]
    book.add_run(4, "q", "d", [13, 14])  # type: ignore[arg-type]
    assert book.take_consecutive(2, 1) is None  # not the oldest: nothing settled
    assert book.take_consecutive(1, 4) == [("q", "c", [10, 11, 12]), ("q", "d", [13])]
    assert list(book) == [5] and len(book) == 1
    assert book.take_consecutive(5, 2) is None and list(book) == [5]  # tag 6 was never delivered


def test_a_consumers_runs_join_without_changing_the_lists_given() -> None:
    """A run that continues the last one (same queue and consumer, the next tags) joins it, so in-order
    acks of several rounds take one slice; the lists handed in (which a queue may hold too) stay as
    they were; a gap in the tags, another consumer or a run settled out of order starts a new run."""
    book = UnackedBook()
    first, second = [10, 11, 12], [20, 21]
    book.add_run(1, "q", "c", first)  # type: ignore[arg-type]
    book.add_run(4, "q", "c", second)  # type: ignore[arg-type]
    book.add_run(6, "q", "c", [30])  # type: ignore[arg-type]
    assert first == [10, 11, 12] and second == [20, 21]
    assert len(book._runs) == 1 and list(book) == [1, 2, 3, 4, 5, 6]
    assert book.take_consecutive(1, 5) == [("q", "c", [10, 11, 12, 20, 21])]
    book.add_run(8, "q", "c", [40, 41])  # type: ignore[arg-type]  (tag 7 was never given: a gap)
    book.add_run(10, "q", "d", [50, 51])  # type: ignore[arg-type]
    assert len(book._runs) == 3 and list(book) == [6, 8, 9, 10, 11]
    assert book.pop(9) == ("q", 41, "c")
    book.add_run(12, "q", "d", [52])  # type: ignore[arg-type]
    assert list(book) == [6, 8, 10, 11, 12] and book.oldest() == 6
    assert book.take_consecutive(6, 1) == [("q", "c", [30])] and book.oldest() == 8
    for tag in range(13, 3000, 3):  # joined runs stay bounded
        book.add_run(tag, "q", "d", [tag, tag + 1, tag + 2])  # type: ignore[arg-type]
    assert max(len(run.positions) for run in book._runs) <= OWNED_RUN_MAX
    assert list(book) == [8, 10, 11, *range(12, 3001)] and len(book) == 2992


def test_single_deliveries_share_a_run_that_stays_bounded() -> None:
    """One-message runs (a round of one delivery per consumer) join the channel's last run, one piece
    per in-order ack batch; a consumer that always has some unacked does not grow that run for good."""
    book = UnackedBook()
    for tag in range(1, 4):
        book.add_run(tag, "q", "c", [100 + tag])  # type: ignore[arg-type]
    assert book.take_consecutive(1, 3) == [("q", "c", [101, 102, 103])]
    acked = 3
    for tag in range(4, 5000):
        book.add_run(tag, "q", "c", [100 + tag])  # type: ignore[arg-type]
        if tag % 10 == 0:  # acks in order, a few always left unacked
            assert book.take_consecutive(acked + 1, tag - 3 - acked) is not None
            acked = tag - 3
    assert list(book) == list(range(acked + 1, 5000))
    assert max(len(run.positions) for run in book._runs) <= OWNED_RUN_MAX
