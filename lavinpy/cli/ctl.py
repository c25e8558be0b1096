"""`lavinpyctl`: manage a running lavinpy (or RabbitMQ) through its management HTTP API.

Command names, options, default columns, output and exit codes are rabbitmqctl's (see ctl_api for the
exit codes and ctl_output for the formats and -q / -s), so scripts written for rabbitmqctl run
unchanged. The broker is reached at ``--uri http://user:password@host:15672`` (or ``$LAVINPYCTL_URI``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from .. import __version__
from ..wire.passwords import hash_password
from .cluster_ctl import ClusterCtlError, force_leader
from .ctl_api import (
    DEFAULT_URI,
    EXIT_BROKER_ERROR,
    EXIT_DATAERR,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    Api,
    CtlError,
    q,
)
from .ctl_columns import COMMANDS as LIST_COMMANDS
from .ctl_columns import row
from .ctl_federation import COMMANDS as FEDERATION_COMMANDS
from .ctl_federation import add_parsers as add_federation_parsers
from .ctl_limits import COMMANDS as LIMIT_COMMANDS
from .ctl_limits import add_commands as add_limit_commands
from .ctl_node import (
    cmd_await_startup,
    cmd_close_all_connections,
    cmd_cluster_status,
    cmd_ping,
    cmd_set_disk_free_limit,
    cmd_set_vm_memory_high_watermark,
    cmd_status,
)
from .ctl_output import FORMATS, Output, error
from .ctl_shovels import COMMANDS as SHOVEL_COMMANDS
from .ctl_shovels import add_parsers as add_shovel_parsers
from .ctl_topic_permissions import COMMANDS as TOPIC_PERMISSION_COMMANDS
from .ctl_topic_permissions import add_commands as add_topic_permission_commands

# list command -> (API path, rabbitmqctl's default columns); the full specs are in ctl_columns
LISTS: dict[str, tuple[str, list[str]]] = {name: (c.path, c.defaults) for name, c in LIST_COMMANDS.items()}
USER_PERMISSION_COLUMNS = ["vhost", "configure", "write", "read"]


def run_list(api: Api, args: argparse.Namespace, out: Output) -> None:
    spec = LIST_COMMANDS[args.command]
    columns = args.columns or spec.defaults
    unknown = spec.unknown(columns)
    if unknown:
        raise CtlError(f"Error (argument validation): Info key(s) {','.join(unknown)} are not supported\n"
                       f"{args.command} accepts: {', '.join(spec.columns)}", EXIT_USAGE)
    try:
        items = api.call("GET", spec.path.format(vhost=q(args.vhost)))
        if spec.keep is not None:
            items = [item for item in items if spec.keep(item)]
        if getattr(args, "offline", False) and not getattr(args, "online", False):
            items = []  # the broker that answers holds them all
    except CtlError as e:
        if e.status == 404 and "{vhost}" in spec.path:  # rabbitmqctl's answer and exit code (EX_DATAERR)
            raise CtlError(f"Virtual host '{args.vhost}' does not exist", EXIT_DATAERR, 404) from None
        raise
    out.banner(spec.banner.format(vhost=args.vhost))
    out.rows([row(args.command, item, columns) for item in items], columns)


def cmd_list_user_permissions(api: Api, args: argparse.Namespace, out: Output) -> None:
    items = api.call("GET", f"/api/users/{q(args.user)}/permissions")
    out.banner(f'Listing permissions for user "{args.user}" ...')
    out.rows([{c: i.get(c) for c in USER_PERMISSION_COLUMNS} for i in items], USER_PERMISSION_COLUMNS)


def _user(api: Api, name: str) -> dict[str, Any]:
    return api.call("GET", f"/api/users/{q(name)}")


def _tags_text(tags: Any) -> str:
    return ",".join(tags) if isinstance(tags, list) else (tags or "")


def cmd_add_user(api: Api, args: argparse.Namespace, out: Output) -> None:
    api.call("PUT", f"/api/users/{q(args.user)}", {"password": args.password, "tags": ""})


def cmd_authenticate_user(api: Api, args: argparse.Namespace, out: Output) -> None:
    """Check a user's password against the broker (any user: management tags are not needed)."""
    out.banner(f'Authenticating user "{args.user}" ...')
    as_user = api.as_user(args.user, args.password)
    try:
        as_user.call("GET", "/api/whoami")
    except CtlError as e:
        if e.status is None:  # no answer: nothing was checked
            raise
        # A user without management tags is refused the API only after its password was accepted.
        if not (e.status == 401 and "Not management user" in str(e)):
            raise CtlError(f'Error: failed to authenticate user "{args.user}"', EXIT_BROKER_ERROR, e.status) from None
    print("Success")


def cmd_clear_password(api: Api, args: argparse.Namespace, out: Output) -> None:
    """The user keeps its tags and permissions but can no longer log in with a password."""
    user = _user(api, args.user)
    api.call("PUT", f"/api/users/{q(args.user)}", {"password_hash": "", "tags": _tags_text(user.get("tags"))})


def cmd_delete_user(api: Api, args: argparse.Namespace, out: Output) -> None:
    api.call("DELETE", f"/api/users/{q(args.user)}")


def cmd_change_password(api: Api, args: argparse.Namespace, out: Output) -> None:
    user = _user(api, args.user)
    api.call("PUT", f"/api/users/{q(args.user)}", {"password": args.password, "tags": _tags_text(user.get("tags"))})


def cmd_set_user_tags(api: Api, args: argparse.Namespace, out: Output) -> None:
    user = _user(api, args.user)
    api.call("PUT", f"/api/users/{q(args.user)}", {
        "password_hash": user.get("password_hash", ""),
        "hashing_algorithm": user.get("hashing_algorithm", "rabbit_password_hashing_sha256"),
        "tags": ",".join(args.tags)})


def cmd_add_vhost(api: Api, args: argparse.Namespace, out: Output) -> None:
    api.call("PUT", f"/api/vhosts/{q(args.name)}")


def cmd_delete_vhost(api: Api, args: argparse.Namespace, out: Output) -> None:
    api.call("DELETE", f"/api/vhosts/{q(args.name)}")


def cmd_set_permissions(api: Api, args: argparse.Namespace, out: Output) -> None:
    api.call("PUT", f"/api/permissions/{q(args.vhost)}/{q(args.user)}",
             {"configure": args.conf, "write": args.write, "read": args.read})


def cmd_clear_permissions(api: Api, args: argparse.Namespace, out: Output) -> None:
    api.call("DELETE", f"/api/permissions/{q(args.vhost)}/{q(args.user)}")


def cmd_set_policy(api: Api, args: argparse.Namespace, out: Output) -> None:
    try:
        definition = json.loads(args.definition)
    except ValueError as e:
        raise CtlError(f"the policy definition is not valid JSON: {e}", EXIT_USAGE) from None
    api.call("PUT", f"/api/policies/{q(args.vhost)}/{q(args.name)}",
             {"pattern": args.pattern, "definition": definition, "priority": args.priority,
              "apply-to": args.apply_to})


def cmd_clear_policy(api: Api, args: argparse.Namespace, out: Output) -> None:
    api.call("DELETE", f"/api/policies/{q(args.vhost)}/{q(args.name)}")


def cmd_purge_queue(api: Api, args: argparse.Namespace, out: Output) -> None:
    api.call("DELETE", f"/api/queues/{q(args.vhost)}/{q(args.queue)}/contents")


def cmd_delete_queue(api: Api, args: argparse.Namespace, out: Output) -> None:
    query = "&".join(s for s, on in (("if-empty=true", args.if_empty), ("if-unused=true", args.if_unused)) if on)
    api.call("DELETE", f"/api/queues/{q(args.vhost)}/{q(args.queue)}" + (f"?{query}" if query else ""))


def cmd_close_connection(api: Api, args: argparse.Namespace, out: Output) -> None:
    api.call("DELETE", f"/api/connections/{q(args.connection)}", headers={"X-Reason": args.reason})


def cmd_export_definitions(api: Api, args: argparse.Namespace, out: Output) -> None:
    progress = None if out.quiet else "export_definitions"  # on stderr, for a reply over 1 MiB
    text = json.dumps(api.call("GET", "/api/definitions", progress=progress), indent=2) + "\n"
    if args.file == "-":
        sys.stdout.write(text)
    else:
        with open(args.file, "w") as f:
            f.write(text)


def cmd_import_definitions(api: Api, args: argparse.Namespace, out: Output) -> None:
    try:
        if args.file == "-":
            raw = sys.stdin.read()
        else:
            with open(args.file) as f:
                raw = f.read()
        definitions = json.loads(raw)
    except (OSError, ValueError) as e:
        raise CtlError(f"cannot read definitions from {args.file}: {e}", EXIT_USAGE) from None
    api.call("POST", "/api/definitions", definitions, progress=None if out.quiet else "import_definitions")


COMMANDS: dict[str, Callable[[Api, argparse.Namespace, Output], None]] = {
    "status": cmd_status, "cluster_status": cmd_cluster_status, "ping": cmd_ping,
    "await_startup": cmd_await_startup, "close_all_connections": cmd_close_all_connections,
    "list_user_permissions": cmd_list_user_permissions,
    "set_vm_memory_high_watermark": cmd_set_vm_memory_high_watermark, "set_disk_free_limit": cmd_set_disk_free_limit,
    "add_user": cmd_add_user, "delete_user": cmd_delete_user, "authenticate_user": cmd_authenticate_user,
    "clear_password": cmd_clear_password,
    "change_password": cmd_change_password, "set_user_tags": cmd_set_user_tags, "add_vhost": cmd_add_vhost,
    "delete_vhost": cmd_delete_vhost, "set_permissions": cmd_set_permissions,
    "clear_permissions": cmd_clear_permissions, "set_policy": cmd_set_policy, "clear_policy": cmd_clear_policy,
    "purge_queue": cmd_purge_queue, "delete_queue": cmd_delete_queue, "close_connection": cmd_close_connection,
    "export_definitions": cmd_export_definitions, "import_definitions": cmd_import_definitions,
    **LIMIT_COMMANDS,
    **SHOVEL_COMMANDS,
    **FEDERATION_COMMANDS,
    **TOPIC_PERMISSION_COMMANDS,
}


class _Parser(argparse.ArgumentParser):
    """Bad usage exits with rabbitmqctl's 64 (EX_USAGE), not argparse's 2."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _global_options(parser: argparse.ArgumentParser, with_defaults: bool) -> None:
    """The options accepted before and after the command (after it, no defaults: they would win)."""
    def default(value: Any) -> Any:
        return value if with_defaults else argparse.SUPPRESS

    parser.add_argument("--uri", default=default(os.environ.get("LAVINPYCTL_URI", DEFAULT_URI)),
                        help="management API, http://user:password@host:15672 (default $LAVINPYCTL_URI)")
    parser.add_argument("--token", default=default(os.environ.get("LAVINPYCTL_TOKEN", "")),
                        help="an OAuth 2 access token sent as Bearer instead of --uri's user and password "
                             "(default $LAVINPYCTL_TOKEN)")
    parser.add_argument("-p", "--vhost", default=default("/"), help="virtual host (default /)")
    parser.add_argument("-f", "--formatter", "--format", dest="format", choices=FORMATS, default=default("table"),
                        help="output format (default table: rabbitmqctl's tab-separated rows)")
    parser.add_argument("-q", "--quiet", action="store_true", default=default(False),
                        help="no informational messages (banners such as 'Listing queues ...')")
    parser.add_argument("-s", "--silent", action="store_true", default=default(False),
                        help="no informational messages and no table header row")
    parser.add_argument("--no-table-headers", dest="no_table_headers", action="store_true",
                        default=default(False), help="no table header row")
    parser.add_argument("-t", "--timeout", type=float, default=default(None),
                        help="seconds to wait for the broker (await_startup: default 300)")
    # rabbitmqctl's node options, accepted so its scripts run unchanged: the broker is the one --uri names.
    parser.add_argument("-n", "--node", default=default(None), help="ignored (rabbitmqctl's): --uri names the broker")
    parser.add_argument("-l", "--longnames", action="store_true", default=default(False),
                        help="ignored (rabbitmqctl's)")


def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    _global_options(common, with_defaults=False)
    parser = _Parser(prog="lavinpyctl", description="Manage a lavinpy broker through its management HTTP API.")
    parser.add_argument("--version", action="version", version=__version__)
    _global_options(parser, with_defaults=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    def add(name: str, help_text: str, *arguments: str) -> argparse.ArgumentParser:
        command = sub.add_parser(name, help=help_text, parents=[common])
        for argument in arguments:
            command.add_argument(argument)
        return command

    add("status", "node status: version, uptime, memory, disk, alarms, listeners, file descriptors "
        "(exit 0 when the broker answers: a container health check)")
    add("cluster_status", "the cluster's nodes (a single node shows itself as a cluster of one)")
    add("ping", "check that the broker answers")
    add("await_startup", "wait until the broker answers (-t seconds, default 300)")
    close_all = add("close_all_connections", "close the vhost's connections (-p), or all with --global",
                    "explanation")
    close_all.add_argument("--global", dest="global_", action="store_true", help="across all vhosts")
    close_all.add_argument("--per-connection-delay", dest="per_connection_delay", type=int, default=0,
                           help="milliseconds between closures")
    close_all.add_argument("--limit", type=int, default=None, help="close at most this many")
    add("set_vm_memory_high_watermark", "the memory alarm's threshold at run time: <fraction of RAM> or "
        "absolute <bytes or size>").add_argument("threshold", nargs="+")
    add("set_disk_free_limit", "the disk alarm's threshold at run time: <bytes or size> or "
        "mem_relative <multiple of RAM>").add_argument("limit", nargs="+")
    for name in LIST_COMMANDS:
        listing = add(name, name.replace("_", " "))
        listing.add_argument("columns", nargs="*", help="columns to show")
        if name == "list_queues":  # one node: every queue is local and online
            listing.add_argument("--online", action="store_true", help="queues on reachable nodes (all of them)")
            listing.add_argument("--offline", action="store_true", help="queues on unreachable nodes (none)")
            listing.add_argument("--local", action="store_true", help="queues on this node (all of them)")
    add("list_user_permissions", "a user's permissions in every vhost", "user")
    add("add_user", "create a user (no tags)", "user", "password")
    add("delete_user", "delete a user", "user")
    add("authenticate_user", "check a user's password (exit 1 when refused)", "user", "password")
    add("clear_password", "remove a user's password (it can no longer log in with one)", "user")
    add("change_password", "set a user's password", "user", "password")
    add("set_user_tags", "replace a user's tags", "user").add_argument("tags", nargs="*")
    add("add_vhost", "create a virtual host", "name")
    add("delete_vhost", "delete a virtual host", "name")
    add("set_permissions", "set a user's permissions in the vhost (-p)", "user", "conf", "write", "read")
    add("clear_permissions", "remove a user's permissions in the vhost (-p)", "user")
    add_topic_permission_commands(add)
    policy = add("set_policy", "set a policy in the vhost (-p)", "name", "pattern", "definition")
    policy.add_argument("--priority", type=int, default=0)
    policy.add_argument("--apply-to", dest="apply_to", choices=("all", "queues", "exchanges"), default="all")
    add("clear_policy", "remove a policy from the vhost (-p)", "name")
    add_limit_commands(add)
    add("purge_queue", "remove a queue's ready messages", "queue")
    delete_queue = add("delete_queue", "delete a queue", "queue")
    delete_queue.add_argument("--if-empty", dest="if_empty", action="store_true")
    delete_queue.add_argument("--if-unused", dest="if_unused", action="store_true")
    close = add("close_connection", "close a connection (320 CONNECTION_FORCED)", "connection")
    close.add_argument("reason", nargs="?", default="Closed via lavinpyctl")
    add("export_definitions", "write the definitions as JSON to FILE (- for stdout)", "file")
    add("import_definitions", "apply a definitions JSON file (- for stdin)", "file")
    add_shovel_parsers(add)
    add_federation_parsers(add)
    add("hash_password", "print a password hash as RabbitMQ stores it (sha256)", "password")
    force = add("force_leader", "let a cluster node lead whatever etcd's ISR says (it may lack confirmed "
                "messages: an operator's decision)", "node_id")
    force.add_argument("--etcd-endpoints", dest="etcd_endpoints", default="127.0.0.1:2379",
                       help="etcd endpoints, comma-separated host:port (default 127.0.0.1:2379)")
    force.add_argument("--etcd-prefix", dest="etcd_prefix", default="lavinpy", help="the cluster's key prefix")
    force.add_argument("--etcd-user", dest="etcd_user", default="",
                       help="etcd user (its password from LAVINPY_CLUSTERING_ETCD_PASSWORD)")
    force.add_argument("--etcd-tls-ca", dest="etcd_tls_ca", default="", help="CA of etcd's certificate (TLS to etcd)")
    force.add_argument("--etcd-tls-cert", dest="etcd_tls_cert", default="", help="client certificate for etcd")
    force.add_argument("--etcd-tls-key", dest="etcd_tls_key", default="",
                       help="key of the client certificate (an encrypted one's passphrase from "
                       "LAVINPY_CLUSTERING_ETCD_TLS_KEY_PASSWORD)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # exits 64 on bad usage
    out = Output(args.format, quiet=args.quiet or args.silent, headers=not (args.silent or args.no_table_headers))
    try:
        if args.command == "hash_password":
            print(hash_password(args.password))
            return EXIT_OK
        if args.command == "force_leader":
            print(force_leader(args.etcd_endpoints, args.etcd_prefix, args.node_id, user=args.etcd_user,
                               password=os.environ.get("LAVINPY_CLUSTERING_ETCD_PASSWORD", ""),
                               tls_files=(args.etcd_tls_ca, args.etcd_tls_cert, args.etcd_tls_key),
                               key_password=os.environ.get("LAVINPY_CLUSTERING_ETCD_TLS_KEY_PASSWORD", "")))
            return EXIT_OK
        if args.command == "await_startup":
            args.timeout = 300.0 if args.timeout is None else args.timeout
            api = Api(args.uri, timeout=min(30.0, max(1.0, args.timeout)), token=args.token)
        else:
            api = Api(args.uri, timeout=30.0 if args.timeout is None else args.timeout, token=args.token)
        if args.command in LIST_COMMANDS:
            run_list(api, args, out)
        else:
            COMMANDS[args.command](api, args, out)
    except CtlError as e:
        error(str(e))
        return e.code
    except ClusterCtlError as e:
        error(str(e))
        return EXIT_UNAVAILABLE
    except BrokenPipeError:  # output piped into head and the like
        return EXIT_OK
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
