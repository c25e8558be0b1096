"""lavinpyctl's list commands: the management API path each reads, rabbitmqctl's default columns and
every column rabbitmqctl accepts, and how a column's value comes out of the API's JSON.

A column rabbitmqctl does not know is a usage error (exit 64), as with rabbitmqctl: a script with a
typo fails instead of reading a blank column. A column the API answers with is read from it; the
others are derived from what the API gives (renamed fields, nested ones, one-node facts such as
"no mirrors"), and only figures lavinpy does not keep (message bytes per queue, disk reads and
writes) stay blank, as rabbitmqctl leaves an item blank that a queue type does not report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Item = dict[str, Any]


def pick(item: Item, column: str) -> Any:
    """A dotted column (``message_stats.publish``) out of an API object; None when absent."""
    value: Any = item
    for key in column.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _tags(item: Item) -> str:
    tags = item.get("tags")
    names = tags if isinstance(tags, list) else [t for t in (tags or "").split(",") if t]
    return "[" + ", ".join(names) + "]"


def _pid(item: Item) -> str:
    # One process holds every queue and connection: its node stands in for an Erlang pid.
    return f"<{item.get('node') or 'lavinpy'}>"


def _vhost_metadata(vhost: Item) -> dict[str, Any]:
    # rabbitmqctl's metadata item: the description, tags and default queue type together.
    return {"description": vhost.get("description") or "", "tags": vhost.get("tags") or [],
            "default_queue_type": vhost.get("default_queue_type") or "classic"}


def _replicated_only(value: Callable[[Item], Any]) -> Callable[[Item], Any]:
    # leader, members and online are quorum and stream queue figures; rabbitmqctl leaves them blank
    # for classic queues.
    return lambda q: value(q) if q.get("type") in ("stream", "quorum") else ""


def _ram(count: str) -> Callable[[Item], Any]:
    # Every message's index entry is in memory and its body in a memory-mapped segment file.
    return lambda q: q.get(count)


QUEUE_DERIVED: dict[str, Callable[[Item], Any]] = {
    "pid": _pid,
    "owner_pid": lambda q: pick(q, "owner_pid_details.name") or "",
    "exclusive_consumer_pid": lambda q: _pid(q) if q.get("exclusive_consumer_tag") else "",
    "exclusive_consumer_tag": lambda q: q.get("exclusive_consumer_tag") or "",
    "messages_ready_ram": _ram("messages_ready"),
    "messages_unacknowledged_ram": _ram("messages_unacknowledged"),
    "messages_ram": _ram("messages"),
    # No mirrored queues: rabbitmqctl leaves these blank for a queue that is not mirrored.
    "slave_pids": lambda q: "",
    "synchronised_slave_pids": lambda q: "",
    "mirror_pids": lambda q: "",
    "synchronised_mirror_pids": lambda q: "",
    "leader": _replicated_only(lambda q: q.get("node")),
    "members": _replicated_only(lambda q: [q.get("node")]),
    "online": _replicated_only(lambda q: [q.get("node")]),
    "policy": lambda q: q.get("policy") or "",
}

QUEUE_COLUMNS = [
    "name", "durable", "auto_delete", "arguments", "policy", "pid", "owner_pid", "exclusive",
    "exclusive_consumer_pid", "exclusive_consumer_tag", "messages_ready", "messages_unacknowledged", "messages",
    "messages_ready_ram", "messages_unacknowledged_ram", "messages_ram", "messages_persistent", "message_bytes",
    "message_bytes_ready", "message_bytes_unacknowledged", "message_bytes_ram", "message_bytes_persistent",
    "head_message_timestamp", "disk_reads", "disk_writes", "consumers", "consumer_utilisation",
    "consumer_capacity", "memory", "slave_pids", "synchronised_slave_pids", "state", "type", "leader", "members",
    "online", "mirror_pids", "synchronised_mirror_pids",
]


@dataclass
class ListCommand:
    path: str  # with {vhost} when the list is per vhost
    defaults: list[str]  # rabbitmqctl's columns when none are named
    columns: list[str]  # every column accepted
    derived: dict[str, Callable[[Item], Any]] = field(default_factory=dict)
    banner: str = ""  # rabbitmqctl's informational line, {vhost} filled in
    keep: Callable[[Item], bool] | None = None  # the API's items this command lists (None: all of them)

    def value(self, item: Item, column: str) -> Any:
        # A derived column wins: it is how rabbitmqctl shows a field the API spells another way
        # (a null exclusive_consumer_tag is an empty cell).
        if column in self.derived:
            return self.derived[column](item)
        return item[column] if column in item else pick(item, column)

    def unknown(self, columns: list[str]) -> list[str]:
        return [c for c in columns if c not in self.columns]


def _picker(source: str) -> Callable[[Item], Any]:
    return lambda item: pick(item, source)


def _renamed(**sources: str) -> dict[str, Callable[[Item], Any]]:
    return {column: _picker(source) for column, source in sources.items()}


COMMANDS: dict[str, ListCommand] = {
    "list_queues": ListCommand("/api/queues/{vhost}", ["name", "messages"], QUEUE_COLUMNS, QUEUE_DERIVED,
                               "Listing queues for vhost {vhost} ..."),
    "list_exchanges": ListCommand("/api/exchanges/{vhost}", ["name", "type"],
                                  ["name", "type", "durable", "auto_delete", "internal", "arguments", "policy"],
                                  {"policy": lambda x: x.get("policy") or ""},
                                  "Listing exchanges for vhost {vhost} ..."),
    "list_bindings": ListCommand(
        "/api/bindings/{vhost}",
        ["source", "source_kind", "destination", "destination_type", "routing_key", "arguments"],
        ["source", "source_kind", "destination", "destination_type", "routing_key", "arguments", "source_name",
         "destination_name", "destination_kind", "properties_key"],
        {"source_kind": lambda b: "exchange", **_renamed(source_name="source", destination_name="destination",
                                                         destination_kind="destination_type")},
        "Listing bindings for vhost {vhost}..."),
    "list_connections": ListCommand(
        "/api/connections", ["user", "peer_host", "peer_port", "state"],
        ["auth_backend", "auth_mechanism", "channel_max", "channels", "client_properties", "connected_at", "frame_max",
         "host",
         "name", "peer_cert_issuer", "peer_cert_subject", "peer_cert_validity", "peer_host", "peer_port", "pid",
         "port", "protocol", "recv_cnt", "recv_oct", "send_cnt", "send_oct", "send_pend", "ssl", "ssl_cipher",
         "ssl_hash", "ssl_key_exchange", "ssl_protocol", "state", "timeout", "user", "vhost"],
        {"pid": _pid, "send_pend": lambda c: 0}, "Listing connections ..."),
    # rabbitmqctl's MQTT plugin command: the MQTT rows of the same connection list, with its names.
    "list_mqtt_connections": ListCommand(
        "/api/connections", ["client_id", "conn_name"],
        ["auth_mechanism", "channel_max", "channels", "client_id", "client_properties", "conn_name",
         "connection_state", "frame_max", "host", "peer_host", "peer_port", "port", "protocol", "ssl", "ssl_cipher",
         "ssl_protocol", "user", "vhost"],
        _renamed(client_id="client_properties.client_id", conn_name="name", connection_state="state"),
        "Listing MQTT connections ...", keep=lambda c: str(c.get("protocol", "")).startswith("MQTT")),
    "list_channels": ListCommand(
        "/api/channels", ["name", "user", "consumer_count", "messages_unacknowledged"],
        ["acks_uncommitted", "confirm", "connection", "consumer_count", "global_prefetch_count",
         "messages_unacknowledged", "messages_uncommitted", "messages_unconfirmed", "name", "number", "pid",
         "prefetch_count", "transactional", "user", "vhost"],
        {"pid": _pid, **_renamed(connection="connection_details.name")}, "Listing channels ..."),
    "list_consumers": ListCommand(
        "/api/consumers/{vhost}",
        ["queue_name", "channel_name", "consumer_tag", "ack_required", "prefetch_count", "active", "arguments"],
        ["queue_name", "channel_name", "channel_pid", "consumer_tag", "ack_required", "prefetch_count", "active",
         "activity_status", "arguments"],
        {"channel_pid": lambda c: _pid(c.get("channel_details") or {}),
         **_renamed(queue_name="queue.name", channel_name="channel_details.name")},
        "Listing consumers in vhost {vhost} ..."),
    "list_users": ListCommand("/api/users", ["user", "tags"], ["user", "tags"],
                              {"user": lambda u: u.get("name")}, "Listing users ..."),
    "list_vhosts": ListCommand("/api/vhosts", ["name"],
                               ["name", "description", "tags", "tracing", "cluster_state", "default_queue_type",
                                "messages", "messages_ready", "messages_unacknowledged", "metadata"],
                               {"default_queue_type": lambda v: v.get("default_queue_type") or "classic",
                                "metadata": _vhost_metadata},
                               "Listing vhosts ..."),
    "list_permissions": ListCommand("/api/vhosts/{vhost}/permissions", ["user", "configure", "write", "read"],
                                    ["user", "configure", "write", "read"], {},
                                    "Listing permissions for vhost \"{vhost}\" ..."),
    "list_policies": ListCommand("/api/policies/{vhost}",
                                 ["vhost", "name", "pattern", "apply-to", "definition", "priority"],
                                 ["vhost", "name", "pattern", "apply-to", "definition", "priority"], {},
                                 "Listing policies for vhost \"{vhost}\" ..."),
}
COMMANDS["list_users"].derived["tags"] = _tags  # the API's list, shown as rabbitmqctl shows it


def row(command: str, item: Item, columns: list[str]) -> dict[str, Any]:
    """The named columns of one API object, as the list command shows them."""
    spec = COMMANDS[command]
    return {c: spec.value(item, c) for c in columns}
