"""lavinpyctl's shovel commands, as rabbitmqctl's shovel plugin names them: shovel_status (also
list_shovels), delete_shovel and restart_shovel, through /api/shovels; and pause_shovel and
resume_shovel (LavinMQ's pause and resume)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from .ctl_api import EXIT_DATAERR, Api, CtlError, q
from .ctl_output import Output

# rabbitmqctl shovel_status's columns (3.12+), from /api/shovels' fields.
COLUMNS = ["name", "vhost", "type", "state", "source", "destination", "termination_reason", "destination_protocol",
           "source_protocol", "last_changed", "source_queue", "destination_queue", "remaining", "remaining_unacked",
           "pending", "forwarded"]
_FIELDS = {"source": "src_uri", "destination": "dest_uri", "termination_reason": "reason",
           "destination_protocol": "dest_protocol", "source_protocol": "src_protocol", "last_changed": "timestamp",
           "source_queue": "src_queue", "destination_queue": "dest_queue"}


def _row(item: dict[str, Any]) -> dict[str, Any]:
    return {c: item.get(_FIELDS.get(c, c), "") for c in COLUMNS}


def cmd_shovel_status(api: Api, args: argparse.Namespace, out: Output) -> None:
    items = api.call("GET", "/api/shovels")
    out.banner("Shovel status on node lavinpy ...")
    out.rows([_row(item) for item in items], COLUMNS)


def _not_found(e: CtlError, args: argparse.Namespace) -> CtlError:
    if e.status == 404:
        return CtlError(f"Error: Shovel with the given name was not found in virtual host '{args.vhost}'",
                        EXIT_DATAERR, 404)
    return e


def cmd_delete_shovel(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.banner(f'Deleting shovel {args.name} in vhost {args.vhost}')
    try:
        api.call("DELETE", f"/api/shovels/vhost/{q(args.vhost)}/{q(args.name)}")
    except CtlError as e:
        raise _not_found(e, args) from None


def cmd_restart_shovel(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.banner(f'Restarting dynamic Shovel {args.name} in virtual host {args.vhost}')
    try:
        api.call("DELETE", f"/api/shovels/vhost/{q(args.vhost)}/{q(args.name)}/restart")
    except CtlError as e:
        raise _not_found(e, args) from None


def _pause_or_resume(api: Api, args: argparse.Namespace, out: Output, verb: str) -> None:
    out.banner(f"{verb.capitalize()[:-1]}ing shovel {args.name} in virtual host {args.vhost}")
    try:
        api.call("PUT", f"/api/shovels/{q(args.vhost)}/{q(args.name)}/{verb}")
    except CtlError as e:
        raise _not_found(e, args) from None


def cmd_pause_shovel(api: Api, args: argparse.Namespace, out: Output) -> None:
    _pause_or_resume(api, args, out, "pause")


def cmd_resume_shovel(api: Api, args: argparse.Namespace, out: Output) -> None:
    _pause_or_resume(api, args, out, "resume")


COMMANDS: dict[str, Callable[[Api, argparse.Namespace, Output], None]] = {
    "shovel_status": cmd_shovel_status, "list_shovels": cmd_shovel_status,
    "delete_shovel": cmd_delete_shovel, "restart_shovel": cmd_restart_shovel,
    "pause_shovel": cmd_pause_shovel, "resume_shovel": cmd_resume_shovel,
}


def add_parsers(add: Callable[..., argparse.ArgumentParser]) -> None:
    add("shovel_status", "the shovels and their state, as rabbitmqctl shovel_status")
    add("list_shovels", "the shovels and their state (shovel_status)")
    add("delete_shovel", "stop and delete a shovel in the vhost (-p)", "name")
    add("restart_shovel", "restart a shovel in the vhost (-p)", "name")
    add("pause_shovel", "stop a shovel in the vhost (-p) moving messages until resumed", "name")
    add("resume_shovel", "let a paused shovel in the vhost (-p) move messages again", "name")
