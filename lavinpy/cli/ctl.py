"""`lavinpyctl`: manage a running lavinpy (or RabbitMQ) through its management HTTP API.

Command names and default columns are those of rabbitmqctl / lavinmqctl. The broker is reached at
``--uri http://user:password@host:15672`` (or ``$LAVINPYCTL_URI``). Exit codes for scripts:
0 done, 1 the broker refused or failed the request, 2 bad usage, 69 the broker is unreachable
(rabbitmqctl's EX_UNAVAILABLE).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlsplit

from ..wire.passwords import hash_password
from .cluster_ctl import ClusterCtlError, force_leader

DEFAULT_URI = "http://guest:guest@127.0.0.1:15672"
EXIT_OK, EXIT_BROKER_ERROR, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 69


class CtlError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class Api:
    """A tiny client of the management API (standard library only)."""

    def __init__(self, uri: str, timeout: float = 30.0) -> None:
        parts = urlsplit(uri)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise CtlError(f"--uri must look like http://user:password@host:15672, not {uri!r}", EXIT_USAGE)
        port = f":{parts.port}" if parts.port else ""
        self.base = f"{parts.scheme}://{parts.hostname}{port}{parts.path.rstrip('/')}"
        user = urllib.request.unquote(parts.username or "guest")
        password = urllib.request.unquote(parts.password or "guest")
        self.auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.timeout = timeout

    def call(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
             accept: tuple[int, ...] = ()) -> Any:
        """The decoded JSON reply; an error status not in ``accept`` raises CtlError."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, method=method)
        request.add_header("Authorization", self.auth)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                payload = response.read()
        except urllib.error.HTTPError as e:
            if e.code in accept:
                payload = e.read()
            else:
                raise CtlError(_error_text(e), EXIT_BROKER_ERROR) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise CtlError(f"cannot reach the broker at {self.base}: {reason}", EXIT_UNAVAILABLE) from None
        return json.loads(payload) if payload.strip() else None


def _error_text(e: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(e.read() or b"{}")
    except ValueError:
        body = {}
    reason = body.get("reason") or body.get("error") or e.reason
    return f"Error: {e.code} {reason}"


def _q(name: str) -> str:
    return quote(name, safe="")


# --- output ------------------------------------------------------------------------------------
def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    return str(value)


def _pick(item: dict[str, Any], column: str) -> Any:
    value: Any = item
    for key in column.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


def print_rows(items: list[dict[str, Any]], columns: list[str], fmt: str) -> None:
    if fmt == "json":
        print(json.dumps([{c: _pick(i, c) for c in columns} for i in items], indent=2))
        return
    rows = [[_cell(_pick(i, c)) for c in columns] for i in items]
    if fmt == "tsv":
        print("\t".join(columns))
        for row in rows:
            print("\t".join(row))
        return
    widths = [max([len(c)] + [len(r[n]) for r in rows]) for n, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


# --- commands ------------------------------------------------------------------------------------
# list command -> (path with {vhost} when per vhost, default columns as rabbitmqctl's)
LISTS: dict[str, tuple[str, list[str]]] = {
    "list_queues": ("/api/queues/{vhost}", ["name", "messages"]),
    "list_exchanges": ("/api/exchanges/{vhost}", ["name", "type"]),
    "list_bindings": ("/api/bindings/{vhost}", ["source", "source_kind", "destination", "destination_type",
                                                "routing_key", "arguments"]),
    "list_connections": ("/api/connections", ["user", "peer_host", "peer_port", "state"]),
    "list_channels": ("/api/channels", ["name", "user", "consumer_count", "messages_unacknowledged"]),
    "list_consumers": ("/api/consumers/{vhost}", ["queue_name", "channel_name", "consumer_tag", "ack_required",
                                                  "prefetch_count", "active", "arguments"]),
    "list_users": ("/api/users", ["user", "tags"]),
    "list_vhosts": ("/api/vhosts", ["name"]),
    "list_permissions": ("/api/vhosts/{vhost}/permissions", ["user", "configure", "write", "read"]),
    "list_policies": ("/api/policies/{vhost}", ["vhost", "name", "pattern", "apply-to", "definition", "priority"]),
}
def _normalise(command: str, item: dict[str, Any]) -> dict[str, Any]:
    """Add the rabbitmqctl column names the API spells differently."""
    item = dict(item)
    if command == "list_users":
        item["user"] = item.get("name")
        tags = item.get("tags")
        item["tags"] = "[" + ", ".join(tags if isinstance(tags, list) else [t for t in (tags or "").split(",") if t]) \
            + "]"
    elif command == "list_consumers":
        item["queue_name"] = _pick(item, "queue.name")
        item["channel_name"] = _pick(item, "channel_details.name")
    elif command == "list_bindings":
        item["source_kind"] = "exchange"
    return item


def run_list(api: Api, args: argparse.Namespace) -> None:
    path, default_columns = LISTS[args.command]
    items = api.call("GET", path.format(vhost=_q(args.vhost)))
    items = [_normalise(args.command, i) for i in items]
    print_rows(items, args.columns or default_columns, args.format)


def cmd_status(api: Api, args: argparse.Namespace) -> None:
    overview = api.call("GET", "/api/overview")
    alarms = api.call("GET", "/api/health/checks/alarms", accept=(503,))  # an alarm is a status, not a failure
    info = {
        "node": overview.get("node"),
        "product": f"{overview.get('product_name', 'RabbitMQ')} {overview.get('product_version', '')}".strip(),
        "management_version": overview.get("management_version"),
        "connections": _pick(overview, "object_totals.connections"),
        "queues": _pick(overview, "object_totals.queues"),
        "messages": _pick(overview, "queue_totals.messages"),
        "alarms": alarms.get("status") if isinstance(alarms, dict) else alarms,
    }
    if args.format == "json":
        print(json.dumps(info, indent=2))
    else:
        sep = "\t" if args.format == "tsv" else ": "
        for key, value in info.items():
            print(f"{key}{sep}{_cell(value)}")


CLUSTER_COLUMNS = ["clustering_id", "role", "amqp_address", "in_sync", "bytes_sent", "bytes_acked", "lag_bytes"]


def cmd_cluster_status(api: Api, args: argparse.Namespace) -> None:
    """Every cluster node with its role; per follower the replication bytes sent, acknowledged, lag."""
    nodes = api.call("GET", "/api/nodes")
    if not any("role" in node for node in nodes):
        raise CtlError("this broker does not run as a cluster node (clustering: false)", EXIT_BROKER_ERROR)
    nodes = sorted(nodes, key=lambda n: (n.get("role") != "leader", str(n.get("clustering_id"))))
    print_rows(nodes, CLUSTER_COLUMNS, args.format)


def _user(api: Api, name: str) -> dict[str, Any]:
    return api.call("GET", f"/api/users/{_q(name)}")


def _tags_text(tags: Any) -> str:
    return ",".join(tags) if isinstance(tags, list) else (tags or "")


def cmd_add_user(api: Api, args: argparse.Namespace) -> None:
    api.call("PUT", f"/api/users/{_q(args.user)}", {"password": args.password, "tags": ""})


def cmd_delete_user(api: Api, args: argparse.Namespace) -> None:
    api.call("DELETE", f"/api/users/{_q(args.user)}")


def cmd_change_password(api: Api, args: argparse.Namespace) -> None:
    user = _user(api, args.user)
    api.call("PUT", f"/api/users/{_q(args.user)}", {"password": args.password, "tags": _tags_text(user.get("tags"))})


def cmd_set_user_tags(api: Api, args: argparse.Namespace) -> None:
    user = _user(api, args.user)
    api.call("PUT", f"/api/users/{_q(args.user)}", {
        "password_hash": user.get("password_hash", ""),
        "hashing_algorithm": user.get("hashing_algorithm", "rabbit_password_hashing_sha256"),
        "tags": ",".join(args.tags)})


def cmd_add_vhost(api: Api, args: argparse.Namespace) -> None:
    api.call("PUT", f"/api/vhosts/{_q(args.name)}")


def cmd_delete_vhost(api: Api, args: argparse.Namespace) -> None:
    api.call("DELETE", f"/api/vhosts/{_q(args.name)}")


def cmd_set_permissions(api: Api, args: argparse.Namespace) -> None:
    api.call("PUT", f"/api/permissions/{_q(args.vhost)}/{_q(args.user)}",
             {"configure": args.conf, "write": args.write, "read": args.read})


def cmd_clear_permissions(api: Api, args: argparse.Namespace) -> None:
    api.call("DELETE", f"/api/permissions/{_q(args.vhost)}/{_q(args.user)}")


def cmd_set_policy(api: Api, args: argparse.Namespace) -> None:
    try:
        definition = json.loads(args.definition)
    except ValueError as e:
        raise CtlError(f"the policy definition is not valid JSON: {e}", EXIT_USAGE) from None
    api.call("PUT", f"/api/policies/{_q(args.vhost)}/{_q(args.name)}",
             {"pattern": args.pattern, "definition": definition, "priority": args.priority,
              "apply-to": args.apply_to})


def cmd_clear_policy(api: Api, args: argparse.Namespace) -> None:
    api.call("DELETE", f"/api/policies/{_q(args.vhost)}/{_q(args.name)}")


def cmd_purge_queue(api: Api, args: argparse.Namespace) -> None:
    api.call("DELETE", f"/api/queues/{_q(args.vhost)}/{_q(args.queue)}/contents")


def cmd_delete_queue(api: Api, args: argparse.Namespace) -> None:
    query = "&".join(q for q, on in (("if-empty=true", args.if_empty), ("if-unused=true", args.if_unused)) if on)
    api.call("DELETE", f"/api/queues/{_q(args.vhost)}/{_q(args.queue)}" + (f"?{query}" if query else ""))


def cmd_close_connection(api: Api, args: argparse.Namespace) -> None:
    api.call("DELETE", f"/api/connections/{_q(args.connection)}", headers={"X-Reason": args.reason})


def cmd_export_definitions(api: Api, args: argparse.Namespace) -> None:
    definitions = api.call("GET", "/api/definitions")
    text = json.dumps(definitions, indent=2) + "\n"
    if args.file == "-":
        sys.stdout.write(text)
    else:
        with open(args.file, "w") as f:
            f.write(text)


def cmd_import_definitions(api: Api, args: argparse.Namespace) -> None:
    try:
        if args.file == "-":
            raw = sys.stdin.read()
        else:
            with open(args.file) as f:
                raw = f.read()
        definitions = json.loads(raw)
    except (OSError, ValueError) as e:
        raise CtlError(f"cannot read definitions from {args.file}: {e}", EXIT_USAGE) from None
    api.call("POST", "/api/definitions", definitions)


def cmd_hash_password(api: Api | None, args: argparse.Namespace) -> None:
    print(hash_password(args.password))


COMMANDS: dict[str, Callable[..., None]] = {
    "status": cmd_status, "cluster_status": cmd_cluster_status,
    "add_user": cmd_add_user, "delete_user": cmd_delete_user,
    "change_password": cmd_change_password, "set_user_tags": cmd_set_user_tags, "add_vhost": cmd_add_vhost,
    "delete_vhost": cmd_delete_vhost, "set_permissions": cmd_set_permissions,
    "clear_permissions": cmd_clear_permissions, "set_policy": cmd_set_policy, "clear_policy": cmd_clear_policy,
    "purge_queue": cmd_purge_queue, "delete_queue": cmd_delete_queue, "close_connection": cmd_close_connection,
    "export_definitions": cmd_export_definitions, "import_definitions": cmd_import_definitions,
    "hash_password": cmd_hash_password,
}


def _global_options(parser: argparse.ArgumentParser, with_defaults: bool) -> None:
    """The options accepted before and after the command (after it, no defaults: they would win)."""
    def default(value: str) -> str:
        return value if with_defaults else argparse.SUPPRESS

    parser.add_argument("--uri", default=default(os.environ.get("LAVINPYCTL_URI", DEFAULT_URI)),
                        help="management API, http://user:password@host:15672 (default $LAVINPYCTL_URI)")
    parser.add_argument("-p", "--vhost", default=default("/"), help="virtual host (default /)")
    parser.add_argument("-f", "--format", choices=("table", "json", "tsv"), default=default("table"))


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    _global_options(common, with_defaults=False)
    parser = argparse.ArgumentParser(prog="lavinpyctl",
                                     description="Manage a lavinpy broker through its management HTTP API.")
    _global_options(parser, with_defaults=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_text: str, *arguments: str) -> argparse.ArgumentParser:
        command = sub.add_parser(name, help=help_text, parents=[common])
        for argument in arguments:
            command.add_argument(argument)
        return command

    add("status", "node status (exit 0 when the broker answers: a container health check)")
    add("cluster_status", "the cluster's nodes: role, in-sync, replication bytes sent/acknowledged/lag")
    for name in LISTS:
        add(name, name.replace("_", " ")).add_argument("columns", nargs="*", help="columns to show")
    add("add_user", "create a user (no tags)", "user", "password")
    add("delete_user", "delete a user", "user")
    add("change_password", "set a user's password", "user", "password")
    add("set_user_tags", "replace a user's tags", "user").add_argument("tags", nargs="*")
    add("add_vhost", "create a virtual host", "name")
    add("delete_vhost", "delete a virtual host", "name")
    add("set_permissions", "set a user's permissions in the vhost (-p)", "user", "conf", "write", "read")
    add("clear_permissions", "remove a user's permissions in the vhost (-p)", "user")
    policy = add("set_policy", "set a policy in the vhost (-p)", "name", "pattern", "definition")
    policy.add_argument("--priority", type=int, default=0)
    policy.add_argument("--apply-to", dest="apply_to", choices=("all", "queues", "exchanges"), default="all")
    add("clear_policy", "remove a policy from the vhost (-p)", "name")
    add("purge_queue", "remove a queue's ready messages", "queue")
    delete_queue = add("delete_queue", "delete a queue", "queue")
    delete_queue.add_argument("--if-empty", dest="if_empty", action="store_true")
    delete_queue.add_argument("--if-unused", dest="if_unused", action="store_true")
    close = add("close_connection", "close a connection (320 CONNECTION_FORCED)", "connection")
    close.add_argument("reason", nargs="?", default="Closed via lavinpyctl")
    add("export_definitions", "write the definitions as JSON to FILE (- for stdout)", "file")
    add("import_definitions", "apply a definitions JSON file (- for stdin)", "file")
    add("hash_password", "print a password hash as RabbitMQ stores it (sha256)", "password")
    force = add("force_leader", "let a cluster node lead whatever etcd's ISR says (it may lack confirmed "
                "messages: an operator's decision)", "node_id")
    force.add_argument("--etcd-endpoints", dest="etcd_endpoints", default="127.0.0.1:2379",
                       help="etcd endpoints, comma-separated host:port (default 127.0.0.1:2379)")
    force.add_argument("--etcd-prefix", dest="etcd_prefix", default="lavinpy", help="the cluster's key prefix")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # exits 2 on bad usage
    try:
        if args.command == "hash_password":
            cmd_hash_password(None, args)
            return EXIT_OK
        if args.command == "force_leader":
            print(force_leader(args.etcd_endpoints, args.etcd_prefix, args.node_id))
            return EXIT_OK
        api = Api(args.uri)
        if args.command in LISTS:
            run_list(api, args)
        else:
            COMMANDS[args.command](api, args)
    except CtlError as e:
        print(str(e), file=sys.stderr)
        return e.code
    except ClusterCtlError as e:
        print(str(e), file=sys.stderr)
        return EXIT_UNAVAILABLE
    except BrokenPipeError:  # output piped into head and the like
        return EXIT_OK
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
