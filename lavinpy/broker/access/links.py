"""The rights a link (a dynamic shovel, a federation upstream) needs from the user who made it, and
passwords kept out of answers.

A link runs as the user recorded on its parameter. When the parameter is set and each time the link
starts, that user must, for every URI of this node (``amqp://`` without a host):
- be able to open the URI's vhost (RabbitMQ's rule: ``user "u" may not connect to vhost "v"``);
- have read and configure permission on the source queue or exchange, and write and configure
  permission on the destination queue or exchange (the default exchange when it names neither), in that
  vhost (LavinMQ's rule).
A federation upstream's user must be able to open its own vhost (the links publish there) and
the vhost of every URI of this node; each link also needs configure and write permission on its
federated exchange or queue (checked when the link starts, as a policy names it).
URIs with a host log in with their own credentials; the broker they name checks those.

Every URI's query keys must be ones lavinpy's URI parser takes (``lavinpy.wire.uri``); those that
name files of the node (cacertfile, certfile, keyfile) only an administrator's links may carry, so
no one else can make the broker open a path and learn from the error whether it exists. Shown to
non-administrators, a link's error says only that its TLS settings could not be loaded, and no
link's error repeats what a peer that is not an AMQP broker sent (``shown_error``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from ...wire.uri import FILE_KEYS, TLS_UNLOADABLE, shown_uri, unknown_keys
from .permissions import Grants, UserPermissions, access_refused
from .users import ADMINISTRATOR_TAG, UserStore

# The parameter components whose values are links run as their creator.
FEDERATION_UPSTREAM = "federation-upstream"
LINK_COMPONENTS = frozenset({"shovel", FEDERATION_UPSTREAM})


def _uris(value: Any) -> list[str]:
    items = value if isinstance(value, list) else [value]
    return [u for u in items if isinstance(u, str)]


def _local_vhost(uri: str, default: str) -> str | None:
    """The vhost of a URI of this node (no host), or None for a URI naming a host."""
    try:
        u = urlsplit(uri)
        if u.hostname:
            return None
    except ValueError:
        return None
    path = u.path[1:] if u.path.startswith("/") else u.path
    return unquote(path) if path else default


def _query_keys(uri: str) -> list[str]:
    try:
        return [key for key, _ in parse_qsl(urlsplit(uri).query, keep_blank_values=True)]
    except ValueError:
        return []  # a URI that does not parse: the component refuses it


def query_refusal(users: UserStore, user: str, value: Mapping[str, Any], grants: Grants | None = None) -> str | None:
    """Why the query keys of the link ``value``'s URIs are refused for ``user``, or None: keys the
    URI parser does not take (for everyone), keys naming files (for all but administrators)."""
    admin = ADMINISTRATOR_TAG in (grants.tags_of(user) if grants is not None else getattr(users.user(user), "tags", ()))
    for uri_key in ("src-uri", "dest-uri", "uri"):
        for uri in _uris(value.get(uri_key)):
            keys = _query_keys(uri)
            unknown = unknown_keys(urlsplit(uri).query) if keys else None
            if unknown:
                return f"{uri_key}: {unknown}"
            files = sorted({k for k in keys if k in FILE_KEYS})
            if files and not admin:
                return (f"{uri_key}: the URI query key(s) " + ", ".join(f"'{k}'" for k in files)
                        + f" name files of the node: only administrators may set them (user \"{user}\" is not one)")
    return None


_TLS_DETAIL = re.compile(re.escape(TLS_UNLOADABLE) + r": [^;]*")
_BAD_FRAME = re.compile(r"(?:bad frame|cannot decode a (?:frame|method)) from the broker(?:: [^;]*)?"
                        r"|the broker refused the AMQP 0-9-1 protocol header \(it speaks [^;]*?\)")
NOT_AMQP = "bad frame from the peer: not an AMQP 0-9-1 broker"


def shown_error(text: str, admin: bool) -> str:
    """A link's error text as a user sees it: what a peer that is not an AMQP 0-9-1 broker sent is not
    repeated (its bytes, or numbers made of them), and non-administrators get no detail of why TLS files
    could not be loaded (no OS error, no file contents)."""
    text = _BAD_FRAME.sub(NOT_AMQP, text)
    return text if admin else _TLS_DETAIL.sub(TLS_UNLOADABLE, text)


def _side(value: Mapping[str, Any], side: str) -> tuple[str, str, tuple[str, str]]:
    """(URI key, resource key, (resource type, name)) of the source or destination."""
    for kind in ("queue", "exchange"):
        key = f"{side}-{kind}"
        if isinstance(value.get(key), str):
            return f"{side}-uri", key, (kind, value[key])
    return f"{side}-uri", f"{side}-exchange", ("exchange", "")  # the destination's original routing: amq.default


def federation_refusal(users: UserStore, user: str, vhost: str, value: Mapping[str, Any],
                       resource: tuple[str, str] | None = None, grants: Grants | None = None) -> str | None:
    """Why ``user`` may not run links of the federation upstream ``value`` of ``vhost`` (into the
    ("exchange" or "queue", name) ``resource`` when named), or None."""
    rights_of: Grants = users if grants is None else grants
    targets = [vhost] + [t for t in (_local_vhost(uri, vhost) for uri in _uris(value.get("uri"))) if t is not None]
    for target in targets:
        if not rights_of.can_access_vhost(user, target):
            return f"uri: user \"{user}\" may not connect to vhost \"{target}\""
    if resource is not None:
        rights = UserPermissions(rights_of, user, vhost)
        resource_type, name = resource
        for kind in ("configure", "write"):
            if not rights.allowed(kind, resource_type, name):
                return f"{resource_type}: {access_refused(kind, resource_type, name, vhost, user).detail}"
    return None


def link_refusal(users: UserStore, user: str, vhost: str, value: Any, component: str = "shovel",
                 resource: tuple[str, str] | None = None, grants: Grants | None = None) -> str | None:
    """Why ``user`` may not run the link ``value`` of ``vhost`` (a text naming the key and the vhost),
    or None when it may. A value of the wrong shape is the component's to refuse: None here.
    ``grants``: the user's rights when they are not the store's (a token creator's, recorded)."""
    if not isinstance(value, Mapping):
        return None
    if grants is None and users.user(user) is None:
        return f"user \"{user}\", who made this {link_kind(component)}, no longer exists"
    rights_of: Grants = users if grants is None else grants
    refusal = query_refusal(users, user, value, grants)
    if refusal is not None:
        return refusal
    if component == FEDERATION_UPSTREAM:
        return federation_refusal(users, user, vhost, value, resource, grants)
    sides = []
    for side, kinds in (("src", ("read", "configure")), ("dest", ("write", "configure"))):
        uri_key, resource_key, resource = _side(value, side)
        if side == "src" and resource_key == "src-exchange" and not isinstance(value.get(resource_key), str):
            continue  # neither src-queue nor src-exchange: the component refuses it
        targets = [t for t in (_local_vhost(uri, vhost) for uri in _uris(value.get(uri_key))) if t is not None]
        for target in targets:  # every URI's vhost first: RabbitMQ's rule
            if not rights_of.can_access_vhost(user, target):
                return f"{uri_key}: user \"{user}\" may not connect to vhost \"{target}\""
        sides.append((resource_key, resource, kinds, targets))
    for resource_key, (resource_type, name), kinds, targets in sides:
        for target in targets:
            rights = UserPermissions(rights_of, user, target)
            for kind in kinds:
                if not rights.allowed(kind, resource_type, name):
                    return f"{resource_key}: {access_refused(kind, resource_type, name, target, user).detail}"
    return None


def link_kind(component: str) -> str:
    """The word for a link of ``component`` in a refusal ("shovel", "upstream")."""
    return "shovel" if component == "shovel" else "upstream"


def masked(value: Any) -> Any:
    """``value`` with every URI in it as statuses show it (lavinpy.wire.uri.shown_uri: passwords masked)."""
    if isinstance(value, str):
        return shown_uri(value) if "://" in value else value
    if isinstance(value, Mapping):
        return {k: masked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v) for v in value]
    return value
