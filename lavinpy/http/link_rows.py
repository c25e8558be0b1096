"""What the shovel and federation-link routes share: the vhost of the route as the requester may open it,
and the links' status rows with their error texts as the requester may see them (broker/access/links.py)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..broker.ops import shown_error
from .context import actor_of
from .errors import ApiError


def route_vhost(request: web.Request) -> str:
    """The route's vhost; 401 when the requester may not open it."""
    vhost = request.match_info["vhost"]
    if not actor_of(request).can_access_vhost(vhost):
        raise ApiError(401, "not_authorised", f"access to vhost '{vhost}' refused for user "
                                              f"'{actor_of(request).name}'")
    return vhost


def rows_shown(request: web.Request, rows: list[dict[str, Any]], error_key: str) -> list[dict[str, Any]]:
    """``rows`` with the text under ``error_key`` as the requester may see it."""
    admin = actor_of(request).is_admin()
    return [{**row, error_key: shown_error(row[error_key], admin)} if row.get(error_key) else row for row in rows]
