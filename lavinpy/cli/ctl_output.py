"""lavinpyctl's output: rabbitmqctl's formats and its quiet and silent modes.

``table`` is rabbitmqctl's default: an informational banner ("Listing queues for vhost / ..."), a
header row, then tab-separated rows. ``-q`` drops the banner, ``--no-table-headers`` the header, and
``-s`` both, so ``lavinpyctl -s list_queues name messages`` prints rows only, as rabbitmqctl does.
``pretty_table`` aligns the columns for people; ``tsv`` is a header and rows with no banner; ``json``
a list of objects.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

FORMATS = ("table", "pretty_table", "tsv", "json")


@dataclass
class Output:
    fmt: str = "table"
    quiet: bool = False  # no informational banner
    headers: bool = True  # the header row of tabular output

    def banner(self, text: str) -> None:
        """An informational line, shown in rabbitmqctl's table format unless quiet."""
        if text and not self.quiet and self.fmt in ("table", "pretty_table"):
            print(text)

    def rows(self, items: list[dict[str, Any]], columns: list[str]) -> None:
        if self.fmt == "json":
            print(json.dumps(items, indent=2))
            return
        rows = [[cell(item.get(c)) for c in columns] for item in items]
        if self.fmt == "pretty_table":
            widths = [max([len(c)] + [len(r[n]) for r in rows]) for n, c in enumerate(columns)]
            if self.headers:
                print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
            for row in rows:
                print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
            return
        if self.headers:
            print("\t".join(columns))
        for row in rows:
            print("\t".join(row))

    def fields(self, info: dict[str, Any]) -> None:
        """One object (a node's status) as ``key: value`` lines, or as JSON."""
        if self.fmt == "json":
            print(json.dumps(info, indent=2))
            return
        sep = "\t" if self.fmt == "tsv" else ": "
        for key, value in info.items():
            print(f"{key}{sep}{cell(value)}")


def cell(value: Any) -> str:
    """A value as rabbitmqctl prints it in a table; tabs and newlines inside would break the rows."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    return str(value).replace("\t", " ").replace("\n", " ")


def error(text: str) -> None:
    print(text, file=sys.stderr)
