"""List replies as RabbitMQ's management API shapes them.

Query parameters: ``name`` (substring, or a regex with ``use_regex=true``: at most 255 characters,
and at most 0.1 s of matching over all the listed names, else 400), ``sort`` (a field, dotted
for nested ones, e.g. ``message_stats.publish``), ``sort_reverse``, ``columns`` (comma-separated,
dotted), ``page`` and ``page_size`` (default 100, at most 500). Without ``page`` the reply is the
plain list; with it, ``{"filtered_count", "item_count", "items", "page", "page_count",
"page_size", "total_count"}``.

No listed object carries a null: RabbitMQ's API gives ``null`` for a name that is not set (a queue's
``policy``, a plain connection's ``ssl_protocol``), and RabbitMQ's own rabbitmqadmin then fails on
that column (its table measures every cell as text). Such text fields are listed as ``""`` (the value
RabbitMQ holds before its JSON encoder turns it into null); any other field without a value is left
out, as RabbitMQ leaves out figures an object does not keep.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from importlib.util import find_spec
from typing import Any

from aiohttp import web

from .context import json_reply
from .errors import bad_request

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 500
# A name filter regex: Python's re cannot stop a match that backtracks for ever ("(a|aa)+$" over a
# long name), so the filter uses the regex module, whose matches take a timeout, with a budget for
# the whole listing; and patterns no longer than a name.
MAX_REGEX_CHARS = 255
REGEX_BUDGET_SECONDS = 0.1
# The regex module (about 1 MiB resident) is loaded with the first use_regex query; that it is installed
# is checked here, so a broker without it still fails at start and not at that query.
if find_spec("regex") is None:
    raise ImportError("the regex module is missing (a dependency of lavinpy's management API)", name="regex")


# Text fields that name something and are "" when there is nothing to name.
TEXT_FIELDS = frozenset({
    "policy", "operator_policy", "exclusive_consumer_tag", "single_active_consumer_tag", "ssl_protocol",
    "ssl_cipher", "ssl_hash", "ssl_key_exchange", "peer_cert_subject", "peer_cert_issuer", "peer_cert_validity",
    "user_who_performed_action", "auth_mechanism", "auth_backend", "client_id", "description"})


def without_nulls(item: dict[str, Any]) -> dict[str, Any]:
    """``item`` with every null text field as "" and every other null left out (nested objects too)."""
    if not any(v is None or isinstance(v, dict) for v in item.values()):
        return item
    out: dict[str, Any] = {}
    for key, value in item.items():
        if value is None:
            if key in TEXT_FIELDS:
                out[key] = ""
        elif isinstance(value, dict):
            out[key] = without_nulls(value)
        else:
            out[key] = value
    return out


def _flag(query: Mapping[str, str], name: str) -> bool:
    return query.get(name, "false").lower() == "true"


def _positive_int(query: Mapping[str, str], name: str, default: int) -> int:
    raw = query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise bad_request(f"{name} must be a positive integer, not {raw!r}") from None
    if value < 1:
        raise bad_request(f"{name} must be a positive integer, not {raw!r}")
    return value


def _get_path(item: Mapping[str, Any], path: list[str]) -> Any:
    value: Any = item
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _sort_key(value: Any) -> tuple[int, Any]:
    # Missing values first, then numbers, then text: mixed types never raise.
    if value is None:
        return (0, 0)
    if isinstance(value, bool | int | float):
        return (1, value)
    return (2, str(value))


def _select_columns(item: Mapping[str, Any], columns: list[list[str]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path in columns:
        value = _get_path(item, path)
        if value is None and not _has_path(item, path):
            continue
        target = out
        for key in path[:-1]:
            target = target.setdefault(key, {})
        target[path[-1]] = value
    return out


def _has_path(item: Mapping[str, Any], path: list[str]) -> bool:
    value: Any = item
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            return False
        value = value[key]
    return True


def name_matcher(query: Mapping[str, str]) -> Callable[[str], bool] | None:
    """The ``name`` filter of a list query (a substring, or a regex with ``use_regex``); None: no filter."""
    name = query.get("name")
    if not name:
        return None
    if _flag(query, "use_regex"):
        return _RegexFilter(name)
    return lambda text: name in text


class _RegexFilter:
    """``use_regex`` matching within a time budget shared by every name of one listing."""

    def __init__(self, pattern: str) -> None:
        if len(pattern) > MAX_REGEX_CHARS:
            raise bad_request(f"name: a regular expression may have at most {MAX_REGEX_CHARS} characters, "
                              f"not {len(pattern)}")
        import regex

        try:
            self.compiled = regex.compile(pattern)
        except (regex.error, ValueError, OverflowError, RecursionError) as e:
            raise bad_request(f"name is not a valid regular expression: {e}") from None
        self.deadline = time.monotonic() + REGEX_BUDGET_SECONDS

    def __call__(self, text: str) -> bool:
        left = self.deadline - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError
            return self.compiled.search(text, timeout=left) is not None
        except TimeoutError:
            raise bad_request(f"name: the regular expression takes too long to match (over "
                              f"{REGEX_BUDGET_SECONDS:g} s over the listed names); make it simpler") from None


def page_of(query: Mapping[str, str], filtered: int) -> tuple[int, int, int] | None:
    """(page, page_size, page_count) when the query asks for a page, checked as RabbitMQ checks them."""
    if "page" not in query:
        return None
    page = _positive_int(query, "page", 1)
    page_size = _positive_int(query, "page_size", DEFAULT_PAGE_SIZE)
    if page_size > MAX_PAGE_SIZE:
        raise bad_request(f"page_size must be at most {MAX_PAGE_SIZE}, not {page_size}")
    page_count = max(1, math.ceil(filtered / page_size))
    if page > page_count:
        raise bad_request(f"page {page} is out of range (there are {page_count} pages)")
    return page, page_size, page_count


def apply_list_query(items: Iterable[dict[str, Any]], query: Mapping[str, str]) -> Any:
    """Filter, sort, page and cut ``items`` as the request's query asks; returns the JSON reply."""
    all_items = [without_nulls(i) for i in items]
    total = len(all_items)
    selected = all_items
    matches = name_matcher(query)
    if matches is not None:
        selected = [i for i in selected if matches(str(i.get("name", "")))]
    sort = query.get("sort")
    reverse = _flag(query, "sort_reverse")
    if sort:
        path = sort.split(".")
        selected = sorted(selected, key=lambda i: _sort_key(_get_path(i, path)), reverse=reverse)
    elif reverse:
        selected = list(reversed(selected))
    filtered = len(selected)
    paging = page_of(query, filtered)
    if paging is not None:
        page, page_size, page_count = paging
        selected = selected[(page - 1) * page_size: page * page_size]
    columns = query.get("columns")
    if columns:
        paths = [c.split(".") for c in columns.split(",") if c]
        selected = [_select_columns(i, paths) for i in selected]
    if paging is None:
        return selected
    return {"filtered_count": filtered, "item_count": len(selected), "items": selected, "page": page,
            "page_count": page_count, "page_size": page_size, "total_count": total}


def object_reply(item: dict[str, Any]) -> web.Response:
    """One object's reply (GET of a queue, a connection), its nulls as a listing's."""
    return json_reply(without_nulls(item))


def listed(request: web.Request, items: list[dict[str, Any]]) -> web.Response:
    """A list route's reply: ``items`` paged, sorted, filtered and cut as the request's query asks."""
    return json_reply(apply_list_query(items, request.query))
