"""The checker: pure functions over a run's history (workload.py) and fault log (nemesis.py).

Hard failures: a confirmed id never delivered (lost), a delivered id nobody published (unexpected), a
confirmed declare whose queue is gone, a recovery that needed more than its bound, two nodes serving
at once for longer than a tolerance, and confirms from a node after another began serving.
Reported only: duplicates (redelivered, or fresh: a second delivery not flagged as redelivered),
messages with no known outcome that arrived anyway, failover times and windows without confirms.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Limits:
    overlap: float = 0.3  # seconds two nodes may both answer the serving probe (probe granularity)
    late_margin: float = 0.5  # a confirm this long after another node began serving is late
    late_confirms: int = 0  # late confirms tolerated
    gap: float = 1.0  # windows without confirms longer than this are listed


@dataclass
class Result:
    figures: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    lost: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    records = []
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return records
    for line in lines:
        with_content = line.strip()
        if not with_content:
            continue
        try:
            records.append(json.loads(with_content))
        except ValueError:
            continue  # a line cut by a kill
    return records


def nearest_fault(t: float, events: list[dict[str, Any]]) -> str:
    """The fault event closest in time to ``t`` (the last one started before it, if any)."""
    faults = [e for e in events if e.get("k") in ("fault", "heal")]
    if not faults:
        return "no fault"
    before = [e for e in faults if e["t"] <= t]
    e = before[-1] if before else faults[0]
    return f"{abs(t - e['t']):.2f} s {'after' if e['t'] <= t else 'before'} {e['k']} '{e.get('what', '')}'"


def serving_intervals(history: list[dict[str, Any]], end: float) -> dict[str, list[tuple[float, float]]]:
    """Per node, [first answer, last answer] of every run of answers to the serving probe."""
    intervals: dict[str, list[tuple[float, float]]] = defaultdict(list)
    opened: dict[str, float] = {}
    for e in history:
        if e["k"] != "probe":
            continue
        node = e["n"]
        if e["up"]:
            opened[node] = e["t"]
        elif node in opened:
            start = opened.pop(node)
            intervals[node].append((start, max(start, e.get("last", start))))
    for node, start in opened.items():
        intervals[node].append((start, end))
    return dict(intervals)


def overlaps(intervals: dict[str, list[tuple[float, float]]]) -> list[tuple[float, float, list[str]]]:
    """Every span in which two or more nodes answered the serving probe, with the nodes involved."""
    # At equal times an end (-1) sorts before a start (+1): touching spans do not overlap.
    points = sorted((t, delta, node) for node, spans in intervals.items() for s, e in spans
                    for t, delta in ((s, 1), (e, -1)))
    active: Counter[str] = Counter()
    found: list[tuple[float, float, list[str]]] = []
    start: float | None = None
    nodes: set[str] = set()
    for t, delta, node in points:
        active[node] += delta
        serving = {n for n, c in active.items() if c > 0}
        if len(serving) >= 2:
            if start is None:
                start, nodes = t, set()
            nodes |= serving
        elif start is not None:
            if t > start:
                found.append((start, t, sorted(nodes)))
            start = None
    return found


def failovers(intervals: dict[str, list[tuple[float, float]]]) -> list[dict[str, Any]]:
    """Each change of the serving node: from whom, to whom, and the time nobody served."""
    spans = sorted((s, e, node) for node, items in intervals.items() for s, e in items)
    changes = []
    for (_s0, e0, n0), (s1, _e1, n1) in zip(spans, spans[1:], strict=False):
        if n1 != n0:
            changes.append({"from": n0, "to": n1, "at": round(s1, 3), "gap": round(s1 - e0, 3)})
    return changes


def late_confirms(history: list[dict[str, Any]], intervals: dict[str, list[tuple[float, float]]],
                  margin: float) -> list[dict[str, Any]]:
    """Confirms on a direct connection to node X more than ``margin`` after some other node began
    serving, when that node began after the connection to X was made (X's term had ended)."""
    direct = {(e["p"], e["c"]): (e["n"], e["t"]) for e in history if e["k"] == "conn" and e.get("direct")}
    starts = [(s, node) for node, spans in intervals.items() for s, _ in spans]
    invoked = {e["id"]: (e["p"], e["c"]) for e in history if e["k"] == "invoke"}
    late = []
    for e in history:
        if e["k"] != "ok" or e["id"] not in invoked or invoked[e["id"]] not in direct:
            continue
        node, opened = direct[invoked[e["id"]]]
        others = [(s, n) for s, n in starts if n != node and opened < s < e["t"] - margin]
        if others:
            s, n = others[0]
            late.append({"id": e["id"], "node": node, "t": e["t"], "other": n, "after": round(e["t"] - s, 3)})
    return late


def gaps(times: list[float], limit: float, start: float, end: float) -> list[tuple[float, float]]:
    points = [start, *sorted(times), end]
    return [(a, b) for a, b in zip(points, points[1:], strict=False) if b - a > limit]


def check(history: list[dict[str, Any]], events: list[dict[str, Any]], existing_queues: set[str] | None,
          limits: Limits | None = None) -> Result:
    """Check one run. ``existing_queues``: the queue names after healing (None: not checked)."""
    limits = limits or Limits()
    result = Result()
    figures = result.figures
    times = [e["t"] for e in history] or [0.0]
    start, end = min(times), max(times)
    invoked = {e["id"]: e for e in history if e["k"] == "invoke"}
    confirmed = {e["id"]: e for e in history if e["k"] == "ok"}
    nacked = {e["id"] for e in history if e["k"] == "fail"}
    unknown = {e["id"] for e in history if e["k"] == "info"} - confirmed.keys()
    deliveries: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in history:
        if e["k"] == "deliver":
            deliveries[e["id"]].append(e)

    lost = sorted(confirmed.keys() - deliveries.keys(), key=lambda i: confirmed[i]["t"])
    result.lost = [{"id": i, "confirmed_at": round(confirmed[i]["t"], 3), "node": confirmed[i]["n"],
                    "fault": nearest_fault(confirmed[i]["t"], events)} for i in lost]
    unexpected = sorted(deliveries.keys() - invoked.keys())
    declared = sorted({e["q"] for e in history if e["k"] == "dok"})
    missing_declares = [] if existing_queues is None else [q for q in declared if q not in existing_queues]

    redelivered = fresh = 0
    for copies in deliveries.values():
        for copy in copies[1:]:
            if copy["r"]:
                redelivered += 1
            else:
                fresh += 1
    dup_counts = [len(c) for c in deliveries.values() if len(c) > 1]

    intervals = serving_intervals(history, end)
    both = overlaps(intervals)
    late = late_confirms(history, intervals, limits.late_margin)
    recoveries = [e for e in events if e["k"] == "recovered"]
    unrecovered = [e for e in events if e["k"] == "recovery-failed"]
    ok_times = [e["t"] for e in confirmed.values()]
    publishing = [e["t"] for e in history if e["k"] == "invoke"]
    no_confirms = gaps(ok_times, limits.gap, min(publishing, default=start), max(publishing, default=start))

    figures.update({
        "attempted": len(invoked), "confirmed": len(confirmed), "nacked": len(nacked), "unknown": len(unknown),
        "delivered_ids": len(deliveries), "deliveries": sum(len(c) for c in deliveries.values()),
        "lost": len(lost), "unexpected": len(unexpected),
        "unknown_delivered": len(unknown & deliveries.keys()), "nacked_delivered": len(nacked & deliveries.keys()),
        "duplicates": sum(n - 1 for n in dup_counts), "duplicate_ids": len(dup_counts),
        "max_copies": max(dup_counts, default=1), "redelivered_duplicates": redelivered,
        "fresh_duplicates": fresh, "declares_confirmed": len(declared), "declares_missing": missing_declares,
        "overlap_total": round(sum(b - a for a, b, _ in both), 3),
        "overlaps": [{"from": round(a, 3), "to": round(b, 3), "nodes": n} for a, b, n in both],
        "late_confirms": late[:20], "late_confirm_count": len(late),
        "failovers": failovers(intervals),
        "recoveries": [round(e.get("after", 0.0), 2) for e in recoveries],
        "unrecovered": [e.get("what", "") for e in unrecovered],
        "no_confirm_windows": [{"from": round(a, 3), "seconds": round(b - a, 2), "fault": nearest_fault(a, events)}
                               for a, b in no_confirms],
        "duration": round(end - start, 1),
    })

    if lost:
        shown = "; ".join(f"{x['id']} (confirmed at {x['confirmed_at']} via {x['node']}, {x['fault']})"
                          for x in result.lost[:3])
        result.failures.append(f"{len(lost)} confirmed messages lost: {shown}")
    if unexpected:
        result.failures.append(f"{len(unexpected)} delivered ids were never published: {unexpected[:10]}")
    if missing_declares:
        result.failures.append(f"confirmed durable queues missing after healing: {missing_declares[:10]}")
    for e in unrecovered:
        result.failures.append(f"no recovery without an operator: {e.get('what', '')}")
    long_overlaps = [(a, b, n) for a, b, n in both if b - a > limits.overlap]
    if long_overlaps:
        shown = "; ".join(f"{'+'.join(n)} for {b - a:.2f} s at {a:.2f} ({nearest_fault(a, events)})"
                          for a, b, n in long_overlaps[:5])
        result.failures.append(f"two nodes served at once: {shown}")
    if len(late) > limits.late_confirms:
        shown = "; ".join(f"{x['id']} from {x['node']} {x['after']} s after {x['other']} began serving"
                          for x in late[:5])
        result.failures.append(f"{len(late)} late confirms: {shown}")
    return result


def summary(name: str, result: Result) -> str:
    """The human summary printed in the test output."""
    f = result.figures
    lines = [
        f"== {name}: {'PASS' if result.ok else 'FAIL'} ({f.get('duration', 0)} s of history)",
        f"   published {f['attempted']}, confirmed {f['confirmed']}, nacked {f['nacked']}, unknown {f['unknown']} "
        f"({f['unknown_delivered']} of them delivered)",
        f"   delivered {f['delivered_ids']} ids in {f['deliveries']} deliveries; lost {f['lost']}, "
        f"unexpected {f['unexpected']}",
        f"   duplicates {f['duplicates']} over {f['duplicate_ids']} ids (max {f['max_copies']} copies): "
        f"{f['redelivered_duplicates']} redelivered, {f['fresh_duplicates']} fresh",
        f"   declares confirmed {f['declares_confirmed']}, missing {len(f['declares_missing'])}",
        f"   serving overlap {f['overlap_total']} s, late confirms {f['late_confirm_count']}",
        "   failovers: " + (", ".join(f"{x['from']}->{x['to']} {x['gap']:+.2f} s" for x in f["failovers"]) or "none"),
        "   recoveries after heal (s): " + (", ".join(str(r) for r in f["recoveries"]) or "none"),
        "   windows without confirms: " + (", ".join(f"{w['seconds']} s ({w['fault']})"
                                                      for w in f["no_confirm_windows"][:8]) or "none"),
    ]
    lines += [f"   FAILURE: {x}" for x in result.failures]
    return "\n".join(lines)
