"""A link's settlement of upstream deliveries under this node's confirms (in process, no broker)."""

from __future__ import annotations

from lavinpy.federation.link import Settlement


def _published(tags: list[int]) -> Settlement:
    settlement = Settlement()
    for tag in tags:
        settlement.published(tag)
    return settlement


def test_a_multiple_confirm_acks_the_run_at_once() -> None:
    s = _published([11, 12, 13, 14])
    assert s.confirmed(3, True, False) == (13, [])  # one basic.ack multiple for 11..13
    assert s.confirmed(4, False, False) == (14, [])
    assert not s.pending and not s.answered


def test_single_confirms_out_of_order_wait_for_the_earlier_ones() -> None:
    s = _published([1, 2, 3])
    assert s.confirmed(3, False, False) == (None, [])  # 1 and 2 unconfirmed: nothing settled upstream yet
    assert s.confirmed(1, False, False) == (1, [])
    assert s.confirmed(2, False, False) == (3, [])


def test_nacks_go_back_one_by_one_before_the_ack() -> None:
    s = _published([5, 6, 7, 8])
    assert s.confirmed(3, False, True) == (None, [])  # a single nack behind unconfirmed ones: kept as a nack
    assert s.confirmed(4, True, False) == (8, [7])  # the multiple ack does not turn it into an ack
    s = _published([1, 2])
    assert s.confirmed(2, True, True) == (None, [1, 2])


def test_cleared_for_a_new_session() -> None:
    s = _published([1, 2])
    s.clear()
    s.published(1)
    assert s.confirmed(1, False, False) == (1, [])
