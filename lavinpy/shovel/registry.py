"""The node's links, shovels and federation links, in one registry: each kind registers how to list its
status rows (the same rows /api/shovels and /api/federation-links answer with), and what reads every
link (the Prometheus endpoint) reads them here rather than from each kind.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Rows = Callable[[], list[dict[str, Any]]]


class LinkRegistry:
    """Kinds of links ("shovel", "federation") and their status rows."""

    def __init__(self) -> None:
        self._kinds: dict[str, Rows] = {}

    def register(self, kind: str, rows: Rows) -> None:
        self._kinds[kind] = rows

    def kinds(self) -> list[str]:
        return sorted(self._kinds)

    def rows(self, kind: str) -> list[dict[str, Any]]:
        """The status rows of the links of ``kind`` (none for a kind not registered)."""
        rows = self._kinds.get(kind)
        return rows() if rows is not None else []
