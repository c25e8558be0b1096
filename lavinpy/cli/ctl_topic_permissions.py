"""lavinpyctl's topic permission commands, with rabbitmqctl's argument forms:

    set_topic_permissions [-p vhost] <user> <exchange> <write> <read>
    clear_topic_permissions [-p vhost] <user> [<exchange>]
    list_topic_permissions [-p vhost]                 list_user_topic_permissions <user>
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from .ctl_api import Api, q
from .ctl_output import Output

AddCommand = Callable[..., argparse.ArgumentParser]


def cmd_set_topic_permissions(api: Api, args: argparse.Namespace, out: Output) -> None:
    api.call("PUT", f"/api/topic-permissions/{q(args.vhost)}/{q(args.user)}",
             {"exchange": args.exchange, "write": args.write, "read": args.read})


def cmd_clear_topic_permissions(api: Api, args: argparse.Namespace, out: Output) -> None:
    path = f"/api/topic-permissions/{q(args.vhost)}/{q(args.user)}"
    if args.exchange is not None:
        path += f"?exchange={q(args.exchange)}"
    api.call("DELETE", path)


def cmd_list_topic_permissions(api: Api, args: argparse.Namespace, out: Output) -> None:
    items = api.call("GET", f"/api/vhosts/{q(args.vhost)}/topic-permissions")
    out.banner(f'Listing topic permissions for vhost "{args.vhost}" ...')
    out.rows(items, ["user", "exchange", "write", "read"])


def cmd_list_user_topic_permissions(api: Api, args: argparse.Namespace, out: Output) -> None:
    items = api.call("GET", f"/api/users/{q(args.user)}/topic-permissions")
    out.banner(f'Listing topic permissions for user "{args.user}" ...')
    out.rows(items, ["vhost", "exchange", "write", "read"])


COMMANDS: dict[str, Callable[[Api, argparse.Namespace, Output], None]] = {
    "set_topic_permissions": cmd_set_topic_permissions,
    "clear_topic_permissions": cmd_clear_topic_permissions,
    "list_topic_permissions": cmd_list_topic_permissions,
    "list_user_topic_permissions": cmd_list_user_topic_permissions,
}


def add_commands(add: AddCommand) -> None:
    """Add the commands' parsers; ``add(name, help, *positional arguments)`` makes one."""
    add("set_topic_permissions", "set a user's topic permissions on an exchange in the vhost (-p)",
        "user", "exchange", "write", "read")
    add("clear_topic_permissions", "remove a user's topic permissions in the vhost (-p), or on one exchange",
        "user").add_argument("exchange", nargs="?", default=None)
    add("list_topic_permissions", "the topic permissions in the vhost (-p)")
    add("list_user_topic_permissions", "a user's topic permissions in every vhost", "user")
