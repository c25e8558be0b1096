"""lavinpyctl's federation commands, as rabbitmqctl's federation plugin names them: federation_status and
restart_federation_link, through /api/federation-links."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from .ctl_api import EXIT_DATAERR, Api, CtlError, q
from .ctl_output import Output

COLUMNS = ["type", "name", "vhost", "id", "upstream", "upstream_name", "uri", "status", "local_connection",
           "last_changed", "error"]


def _row(item: dict[str, Any]) -> dict[str, Any]:
    """The link's columns; name and upstream_name are its exchange's or queue's (by its type)."""
    kind = item.get("type", "exchange")
    names = {"name": item.get(kind, ""), "upstream_name": item.get(f"upstream_{kind}", ""),
             "last_changed": item.get("timestamp", "")}
    return {c: names[c] if c in names else item.get(c, "") for c in COLUMNS}


def cmd_federation_status(api: Api, args: argparse.Namespace, out: Output) -> None:
    items = api.call("GET", "/api/federation-links")
    out.banner("Listing federation links on node lavinpy ...")
    out.rows([_row(item) for item in items], COLUMNS)


def cmd_restart_federation_link(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.banner(f"Restarting federation link {args.link_id}")
    for item in api.call("GET", "/api/federation-links"):
        if item.get("id") == args.link_id:
            api.call("DELETE", f"/api/federation-links/vhost/{q(item['vhost'])}/{q(item['id'])}/"
                               f"{q(item['node'])}/restart")
            return
    raise CtlError(f"Error: Federation link with ID {args.link_id} not found", EXIT_DATAERR, 404)


COMMANDS: dict[str, Callable[[Api, argparse.Namespace, Output], None]] = {
    "federation_status": cmd_federation_status, "restart_federation_link": cmd_restart_federation_link,
}


def add_parsers(add: Callable[..., argparse.ArgumentParser]) -> None:
    add("federation_status", "the federation links and their state, as rabbitmqctl federation_status")
    add("restart_federation_link", "restart the federation link of that id", "link_id")
