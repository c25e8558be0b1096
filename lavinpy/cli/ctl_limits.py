"""lavinpyctl's limit, operator policy and parameter commands, with rabbitmqctl's argument forms:

    set_vhost_limits [-p vhost] <definition>          clear_vhost_limits [-p vhost]
    list_vhost_limits [-p vhost] [--global]
    set_user_limits <user> <definition>               clear_user_limits <user> <limit>|all
    list_user_limits [--user <user>] [--global]
    set_operator_policy [-p vhost] [--priority p] [--apply-to a] <name> <pattern> <definition>
    clear_operator_policy [-p vhost] <name>           list_operator_policies [-p vhost]
    set_parameter [-p vhost] <component> <name> <value>
    clear_parameter [-p vhost] <component> <name>     list_parameters [-p vhost]
    set_global_parameter <name> <value>               clear_global_parameter <name>
    list_global_parameters
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from .ctl_api import EXIT_USAGE, Api, CtlError, q
from .ctl_output import Output

AddCommand = Callable[..., argparse.ArgumentParser]
POLICY_COLUMNS = ["vhost", "name", "pattern", "apply-to", "definition", "priority"]


def _json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as e:
        raise CtlError(f"the {what} is not valid JSON: {e}", EXIT_USAGE) from None


def _limits(text: str) -> dict[str, Any]:
    value = _json(text, "limit definition")
    if not isinstance(value, dict):
        raise CtlError("the limit definition must be a JSON object", EXIT_USAGE)
    return value


def cmd_set_vhost_limits(api: Api, args: argparse.Namespace, out: Output) -> None:
    limits = _limits(args.definition)
    if limits:
        api.call("PUT", f"/api/parameters/vhost-limits/{q(args.vhost)}/limits",
                 {"vhost": args.vhost, "component": "vhost-limits", "name": "limits", "value": limits})
    else:
        cmd_clear_vhost_limits(api, args, out)


def cmd_clear_vhost_limits(api: Api, args: argparse.Namespace, out: Output) -> None:
    if api.call("GET", f"/api/vhost-limits/{q(args.vhost)}"):
        api.call("DELETE", f"/api/parameters/vhost-limits/{q(args.vhost)}/limits")


def cmd_list_vhost_limits(api: Api, args: argparse.Namespace, out: Output) -> None:
    if args.global_:
        items = api.call("GET", "/api/vhost-limits")
        out.banner("Getting global limits ...")
        out.rows(items, ["vhost", "limits"] if out.fmt == "json" else ["vhost", "value"])
        return
    items = api.call("GET", f"/api/vhost-limits/{q(args.vhost)}")
    out.banner(f'Getting limits for vhost "{args.vhost}" ...')
    if out.fmt == "json":
        out.rows(items, ["vhost", "value"])
    elif items:
        print(json.dumps(items[0]["value"], separators=(",", ":"), sort_keys=True))


def cmd_set_user_limits(api: Api, args: argparse.Namespace, out: Output) -> None:
    for key, value in _limits(args.definition).items():
        api.call("PUT", f"/api/user-limits/{q(args.user)}/{q(key)}", {"value": value})


def cmd_clear_user_limits(api: Api, args: argparse.Namespace, out: Output) -> None:
    api.call("DELETE", f"/api/user-limits/{q(args.user)}/{q(args.limit)}")


def cmd_list_user_limits(api: Api, args: argparse.Namespace, out: Output) -> None:
    if args.user and not args.global_:
        items = api.call("GET", f"/api/user-limits/{q(args.user)}")
        out.banner(f'Getting limits for user "{args.user}" ...')
        if out.fmt == "json":
            out.rows(items, ["user", "value"])
        elif items:
            print(json.dumps(items[0]["value"], separators=(",", ":"), sort_keys=True))
        return
    out.banner("Getting limits for all users ...")
    out.rows(api.call("GET", "/api/user-limits"), ["user", "value"])


def cmd_set_operator_policy(api: Api, args: argparse.Namespace, out: Output) -> None:
    api.call("PUT", f"/api/operator-policies/{q(args.vhost)}/{q(args.name)}",
             {"pattern": args.pattern, "definition": _json(args.definition, "policy definition"),
              "priority": args.priority, "apply-to": args.apply_to})


def cmd_clear_operator_policy(api: Api, args: argparse.Namespace, out: Output) -> None:
    api.call("DELETE", f"/api/operator-policies/{q(args.vhost)}/{q(args.name)}")


def cmd_list_operator_policies(api: Api, args: argparse.Namespace, out: Output) -> None:
    items = api.call("GET", f"/api/operator-policies/{q(args.vhost)}")
    out.banner(f'Listing operator policy overrides for vhost "{args.vhost}" ...')
    out.rows(items, POLICY_COLUMNS)


def cmd_set_parameter(api: Api, args: argparse.Namespace, out: Output) -> None:
    api.call("PUT", f"/api/parameters/{q(args.component)}/{q(args.vhost)}/{q(args.name)}",
             {"vhost": args.vhost, "component": args.component, "name": args.name,
              "value": _json(args.value, "parameter value")})


def cmd_clear_parameter(api: Api, args: argparse.Namespace, out: Output) -> None:
    api.call("DELETE", f"/api/parameters/{q(args.component)}/{q(args.vhost)}/{q(args.name)}")


def cmd_list_parameters(api: Api, args: argparse.Namespace, out: Output) -> None:
    items = [p for p in api.call("GET", "/api/parameters") if p.get("vhost") == args.vhost]
    out.banner(f'Listing runtime parameters for vhost "{args.vhost}" ...')
    out.rows(items, ["component", "name", "value"])


def cmd_set_global_parameter(api: Api, args: argparse.Namespace, out: Output) -> None:
    api.call("PUT", f"/api/global-parameters/{q(args.name)}",
             {"name": args.name, "value": _json(args.value, "parameter value")})


def cmd_clear_global_parameter(api: Api, args: argparse.Namespace, out: Output) -> None:
    api.call("DELETE", f"/api/global-parameters/{q(args.name)}")


def cmd_list_global_parameters(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.banner("Listing global runtime parameters ...")
    out.rows(api.call("GET", "/api/global-parameters"), ["name", "value"])


COMMANDS: dict[str, Callable[[Api, argparse.Namespace, Output], None]] = {
    "set_vhost_limits": cmd_set_vhost_limits, "clear_vhost_limits": cmd_clear_vhost_limits,
    "list_vhost_limits": cmd_list_vhost_limits, "set_user_limits": cmd_set_user_limits,
    "clear_user_limits": cmd_clear_user_limits, "list_user_limits": cmd_list_user_limits,
    "set_operator_policy": cmd_set_operator_policy, "clear_operator_policy": cmd_clear_operator_policy,
    "list_operator_policies": cmd_list_operator_policies, "set_parameter": cmd_set_parameter,
    "clear_parameter": cmd_clear_parameter, "list_parameters": cmd_list_parameters,
    "set_global_parameter": cmd_set_global_parameter, "clear_global_parameter": cmd_clear_global_parameter,
    "list_global_parameters": cmd_list_global_parameters,
}


def add_commands(add: AddCommand) -> None:
    """Add the commands' parsers; ``add(name, help, *positional arguments)`` makes one."""
    add("set_vhost_limits", "set the vhost's (-p) limits: '{\"max-connections\": n, \"max-queues\": n}'",
        "definition")
    add("clear_vhost_limits", "remove every limit of the vhost (-p)")
    add("list_vhost_limits", "the vhost's (-p) limits, or every vhost's with --global").add_argument(
        "--global", dest="global_", action="store_true")
    add("set_user_limits", "set a user's limits: '{\"max-connections\": n, \"max-channels\": n}'",
        "user", "definition")
    add("clear_user_limits", "remove one limit of a user (or all)", "user", "limit")
    user_limits = add("list_user_limits", "a user's limits (--user), or every user's")
    user_limits.add_argument("--user", default=None)
    user_limits.add_argument("--global", dest="global_", action="store_true")
    policy = add("set_operator_policy", "set an operator policy in the vhost (-p)", "name", "pattern", "definition")
    policy.add_argument("--priority", type=int, default=0)
    policy.add_argument("--apply-to", dest="apply_to", choices=("all", "queues", "classic_queues", "streams"),
                        default="queues")
    add("clear_operator_policy", "remove an operator policy from the vhost (-p)", "name")
    add("list_operator_policies", "the vhost's (-p) operator policies")
    add("set_parameter", "set a runtime parameter in the vhost (-p); the value is JSON", "component", "name", "value")
    add("clear_parameter", "remove a runtime parameter from the vhost (-p)", "component", "name")
    add("list_parameters", "the vhost's (-p) runtime parameters")
    add("set_global_parameter", "set a global runtime parameter; the value is JSON", "name", "value")
    add("clear_global_parameter", "remove a global runtime parameter", "name")
    add("list_global_parameters", "the global runtime parameters")
