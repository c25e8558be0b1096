"""The checker on hand-made histories: it must catch what the scenarios rely on it to catch (no root,
no namespaces: these run everywhere)."""

from __future__ import annotations

from typing import Any

from .checker import Limits, check, overlaps, serving_intervals, summary


def _h(*events: tuple[float, str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"t": t, "k": k, **fields} for t, k, fields in events]


def _published(ident: str, t: float, node: str = "n1", conn: int = 1, outcome: str = "ok") -> list[dict[str, Any]]:
    return _h((t, "invoke", {"p": ident[0], "id": ident, "n": node, "c": conn}),
              (t + 0.01, outcome, {"id": ident, "n": node, "c": conn}))


def _delivered(ident: str, t: float, redelivered: bool = False) -> dict[str, Any]:
    return {"t": t, "k": "deliver", "id": ident, "r": redelivered, "n": "n2", "c": 9}


def test_a_confirmed_message_never_delivered_is_lost_and_named_with_the_nearest_fault() -> None:
    history = _published("A-1", 1.0) + _published("A-2", 2.0) + [_delivered("A-1", 3.0)]
    faults = [{"t": 1.5, "k": "fault", "what": "kill -9 n1"}]
    result = check(history, faults, None)
    assert not result.ok
    assert [x["id"] for x in result.lost] == ["A-2"]
    assert result.lost[0]["node"] == "n1" and "kill -9 n1" in result.lost[0]["fault"]
    assert "1 confirmed messages lost: A-2" in result.failures[0]


def test_unknown_and_nacked_messages_may_be_missing_but_not_unpublished_ones() -> None:
    history = (_published("A-1", 1.0, outcome="info") + _published("A-2", 1.1, outcome="fail")
               + [_delivered("A-1", 2.0), _delivered("Z-9", 2.1)])
    result = check(history, [], None)
    assert result.figures["lost"] == 0 and result.figures["unknown_delivered"] == 1
    assert result.failures == ["1 delivered ids were never published: ['Z-9']"]


def test_duplicates_are_classified_redelivered_or_fresh() -> None:
    history = _published("A-1", 1.0) + _published("A-2", 1.0) + [
        _delivered("A-1", 2.0), _delivered("A-1", 3.0, redelivered=True),
        _delivered("A-2", 2.0), _delivered("A-2", 4.0, redelivered=False)]
    result = check(history, [], None)
    assert result.ok  # duplicates are reported, never failed
    f = result.figures
    assert (f["duplicates"], f["redelivered_duplicates"], f["fresh_duplicates"], f["max_copies"]) == (2, 1, 1, 2)


def test_a_confirmed_declare_whose_queue_is_gone_fails() -> None:
    history = _h((1.0, "dinvoke", {"q": "dq-1", "n": "n1"}), (1.1, "dok", {"q": "dq-1", "n": "n1"}),
                 (2.0, "dinvoke", {"q": "dq-2", "n": "n1"}), (2.1, "dfail", {"q": "dq-2", "n": "n1"}))
    assert check(history, [], {"dq-1"}).ok
    assert check(history, [], set()).failures == ["confirmed durable queues missing after healing: ['dq-1']"]


def test_serving_overlap_beyond_the_tolerance_fails_and_touching_spans_do_not_overlap() -> None:
    probes = _h((1.0, "probe", {"n": "n1", "up": True}), (5.0, "probe", {"n": "n1", "up": False, "last": 4.9}),
                (4.0, "probe", {"n": "n2", "up": True}))
    history = sorted(probes, key=lambda e: e["t"]) + _published("A-1", 6.0) + [_delivered("A-1", 6.5)]
    spans = serving_intervals(history, 7.0)
    assert spans == {"n1": [(1.0, 4.9)], "n2": [(4.0, 7.0)]}
    assert [(a, b) for a, b, _ in overlaps(spans)] == [(4.0, 4.9)]
    result = check(history, [], None)
    assert result.figures["overlap_total"] == 0.9
    assert any("two nodes served at once: n1+n2 for 0.90 s" in f for f in result.failures)
    assert overlaps({"n1": [(1.0, 2.0)], "n2": [(2.0, 3.0)]}) == []
    assert check(history, [], None, Limits(overlap=1.0)).ok


def test_a_confirm_from_a_node_after_another_began_serving_is_late() -> None:
    history = sorted(_h(
        (0.5, "probe", {"n": "n1", "up": True}),
        (0.6, "conn", {"p": "A", "n": "n1", "c": 1, "direct": True}),
        (3.0, "probe", {"n": "n2", "up": True}),
        (3.1, "probe", {"n": "n1", "up": False, "last": 3.05}),
    ) + _published("A-1", 1.0) + _published("A-2", 4.0) + [_delivered("A-1", 5.0), _delivered("A-2", 5.0)],
        key=lambda e: e["t"])
    result = check(history, [], None)
    late = result.figures["late_confirms"]
    assert [x["id"] for x in late] == ["A-2"] and late[0]["other"] == "n2"
    assert any("1 late confirms" in f for f in result.failures)


def test_a_recovery_that_did_not_come_fails_and_the_summary_says_so() -> None:
    history = _published("A-1", 1.0) + [_delivered("A-1", 2.0)]
    events = [{"t": 1.5, "k": "heal", "what": "heal all"},
              {"t": 31.5, "k": "recovery-failed", "what": "heal all: no recovery within 30 s"}]
    result = check(history, events, None)
    assert result.failures == ["no recovery without an operator: heal all: no recovery within 30 s"]
    text = summary("T", result)
    assert "FAIL" in text and "FAILURE: no recovery" in text
