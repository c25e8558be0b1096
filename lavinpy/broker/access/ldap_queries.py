"""RabbitMQ's LDAP authorisation queries, evaluated against a directory.

A query is RabbitMQ's ``advanced.config`` term with its tuples written as YAML lists:

- ``[constant, true]``;
- ``[exists, "<dn pattern>"]``: the object exists;
- ``[in_group, "<group dn pattern>"]`` (or ``[in_group, "<dn>", "<member attribute>"]``): the user's DN is
  a ``member`` (or that attribute) of the group;
- ``[in_group_nested, "<group dn pattern>"]`` (or with the attribute): member directly or through groups
  that are members (searched under ``auth_ldap_group_lookup_base``);
- ``[match, <string>, <regex string>]``, ``[equals, <string>, <string>]``: ``<string>`` is
  ``[string, "<pattern>"]`` (a bare string too) or ``[attribute, "<dn pattern>", "<attribute>"]``;
- ``[not, q]``, ``[and, [q, ...]]``, ``[or, [q, ...]]``;
- ``[for, [[<variable>, <value>, q], ...]]``: the first entry whose variable has that value decides
  (e.g. ``[permission, configure, q]``, ``[resource, queue, q]``).

Patterns take ``${username}``, ``${user_dn}``, ``${vhost}``, ``${resource}`` (queue, exchange, topic),
``${name}``, ``${permission}`` and ``${routing_key}`` as the check knows them. A query that cannot be
evaluated (bad shape, an unknown variable, the directory unreachable) answers no, with a log line.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any, Protocol

log = logging.getLogger("lavinpy.login")

_VARIABLE = re.compile(r"\$\{([a-z_]+)\}")


class QueryError(Exception):
    """The query cannot be evaluated (the text says why)."""


class Directory(Protocol):
    """What a query needs of the directory (a bound LDAP connection)."""

    def exists(self, dn: str, filter: str) -> bool:
        """Whether the object at ``dn`` matches ``filter`` (a base search)."""

    def attribute(self, dn: str, name: str) -> list[str]:
        """The values of the object's attribute ([] when there is none)."""

    def groups_with_member(self, base: str, attribute: str, member: str) -> list[str]:
        """The DNs of the groups under ``base`` whose ``attribute`` names ``member``."""


def fill(pattern: str, values: Mapping[str, str], escape_dn: bool = False) -> str:
    """``${name}`` replaced by its value (escaped for a DN when ``escape_dn``)."""
    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            raise QueryError(f"the query names ${{{name}}}, which this check does not know")
        text = values[name]
        return escape_dn_value(text) if escape_dn and name != "user_dn" else text
    return _VARIABLE.sub(value, pattern)


def escape_dn_value(text: str) -> str:
    """An attribute value for a DN (RFC 4514): the special characters escaped."""
    out = "".join("\\" + c if c in ',+"\\<>;=' else c for c in text)
    if out.startswith((" ", "#")):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out


def escape_filter_value(text: str) -> str:
    """A value for an LDAP search filter (RFC 4515)."""
    return "".join(f"\\{ord(c):02x}" if c in "*()\\\x00" else c for c in text)


def evaluate(query: Any, values: Mapping[str, str], directory: Directory, group_base: str = "") -> bool:
    """The query's answer for a check with these variable ``values`` (``user_dn`` among them)."""
    if isinstance(query, bool):
        return query
    if not isinstance(query, list) or not query or not isinstance(query[0], str):
        raise QueryError(f"not a query: {query!r}")
    kind, args = query[0], query[1:]
    if kind == "constant" and len(args) == 1 and isinstance(args[0], bool):
        return args[0]
    if kind == "exists" and len(args) == 1:
        return directory.exists(fill(str(args[0]), values, True), "(objectClass=*)")
    if kind == "in_group" and len(args) in (1, 2):
        attribute = str(args[1]) if len(args) == 2 else "member"
        return directory.exists(fill(str(args[0]), values, True),
                                f"({attribute}={escape_filter_value(values['user_dn'])})")
    if kind == "in_group_nested" and len(args) in (1, 2):
        attribute = str(args[1]) if len(args) == 2 else "member"
        return _nested(directory, fill(str(args[0]), values, True), attribute, values["user_dn"], group_base)
    if kind == "not" and len(args) == 1:
        return not evaluate(args[0], values, directory, group_base)
    if kind in ("and", "or") and len(args) == 1 and isinstance(args[0], list):
        results = (evaluate(q, values, directory, group_base) for q in args[0])
        return all(results) if kind == "and" else any(results)
    if kind == "match" and len(args) == 2:
        regex = _strings(args[1], values, directory)
        return any(re.search(pattern, subject) is not None
                   for subject in _strings(args[0], values, directory) for pattern in regex)
    if kind == "equals" and len(args) == 2:
        return bool(set(_strings(args[0], values, directory)) & set(_strings(args[1], values, directory)))
    if kind == "for" and len(args) == 1 and isinstance(args[0], list):
        for entry in args[0]:
            if not isinstance(entry, list) or len(entry) != 3:
                raise QueryError(f"a for entry must be [variable, value, query], not {entry!r}")
            variable, value, subquery = entry
            if variable not in values:
                raise QueryError(f"for: this check has no {variable!r}")
            if values[variable] == str(value):
                return evaluate(subquery, values, directory, group_base)
        raise QueryError("for: no entry for this check (the query is incomplete)")
    raise QueryError(f"unknown query form {query!r}")


def _strings(term: Any, values: Mapping[str, str], directory: Directory) -> list[str]:
    if isinstance(term, str):
        return [fill(term, values)]
    if isinstance(term, list) and len(term) == 2 and term[0] == "string":
        return [fill(str(term[1]), values)]
    if isinstance(term, list) and len(term) == 3 and term[0] == "attribute":
        return directory.attribute(fill(str(term[1]), values, True), str(term[2]))
    raise QueryError(f"not a string query: {term!r}")


def _nested(directory: Directory, group: str, attribute: str, member: str, base: str) -> bool:
    """Whether ``member`` is in ``group`` directly or through groups that are members of it."""
    seen: set[str] = set()
    frontier = [member]
    while frontier:
        current = frontier.pop()
        for parent in directory.groups_with_member(base, attribute, current):
            key = parent.lower()
            if key == group.lower():
                return True
            if key not in seen:
                seen.add(key)
                frontier.append(parent)
    return False
