"""Long list replies that leave the event loop to the broker between slices.

Describing and encoding 10,000 queues takes a few hundred milliseconds of CPU; done in one go it
would hold back every delivery for that long. Here the work is done in slices of ``SLICE`` objects
with a turn of the event loop between them, and without a sort only the objects of the requested
page are described, each slice's dicts freed once encoded: garbage that outlives a slice would make
the collector walk the whole heap (every queue of the broker) in one long pause.
"""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from aiohttp import web

from .listing import _flag, apply_list_query, name_matcher, page_of, without_nulls

SLICE = 250


class Named(Protocol):
    name: str


T = TypeVar("T", bound=Named)


async def _encode(objects: Sequence[T], make: Callable[[T], dict[str, Any]], columns: str | None) -> bytes:
    parts = []
    column_query = {"columns": columns} if columns else {}
    for start in range(0, len(objects), SLICE):
        if start:
            await asyncio.sleep(0)
        collecting = gc.isenabled()
        if collecting:
            gc.disable()  # this slice's dicts are freed below: no collection needs to look at them
        try:
            items = [without_nulls(make(o)) for o in objects[start:start + SLICE]]
            if column_query:
                items = apply_list_query(items, column_query)
            parts.append(json.dumps(items)[1:-1])
            del items
        finally:
            if collecting:
                gc.enable()
    return ("[" + ",".join(p for p in parts if p) + "]").encode()


async def list_reply(objects: Sequence[T], make: Callable[[T], dict[str, Any]],
                     query: Mapping[str, str]) -> web.Response:
    """A list endpoint's reply, filtered, sorted, paged and cut as ``apply_list_query`` does."""
    if query.get("sort"):
        # Any field may be the sort key: describe everything (in slices), then sort and page.
        items: list[dict[str, Any]] = []
        for start in range(0, len(objects), SLICE):
            if start:
                await asyncio.sleep(0)
            items.extend(without_nulls(make(o)) for o in objects[start:start + SLICE])
        result = apply_list_query(items, query)
        del items
        page = result if isinstance(result, list) else result["items"]
        body = json.dumps(page).encode()
        if not isinstance(result, list):
            body = _paged(result, body)
        return web.Response(body=body, content_type="application/json")
    # Name filter and paging on the names (strings and ints: nothing for the collector to track);
    # the chosen objects are described slice by slice.
    chosen, paging = _select_by_name(objects, query)
    body = await _encode(chosen, make, query.get("columns"))
    if paging is not None:
        body = _paged(paging, body)
    return web.Response(body=body, content_type="application/json")


def _select_by_name(objects: Sequence[T], query: Mapping[str, str]) -> tuple[list[T], dict[str, Any] | None]:
    """``apply_list_query``'s filter, reverse and page steps (same rules and errors), on names only."""
    indexes = list(range(len(objects)))
    matches = name_matcher(query)
    if matches is not None:
        indexes = [n for n in indexes if matches(objects[n].name)]
    if _flag(query, "sort_reverse"):
        indexes.reverse()
    filtered = len(indexes)
    paging = page_of(query, filtered)
    if paging is None:
        return [objects[n] for n in indexes], None
    page, page_size, page_count = paging
    chosen = [objects[n] for n in indexes[(page - 1) * page_size: page * page_size]]
    return chosen, {"filtered_count": filtered, "item_count": len(chosen), "page": page, "page_count": page_count,
                    "page_size": page_size, "total_count": len(objects)}


def _paged(result: dict[str, Any], encoded_items: bytes) -> bytes:
    """The paged reply object with its items already encoded (keys in RabbitMQ's order)."""
    head = {k: v for k, v in result.items() if k != "items"}
    head["items"] = None
    text = json.dumps(dict(sorted(head.items())))
    return text.replace('"items": null', '"items": ' + encoded_items.decode(), 1).encode()
