"""amqp:// and amqps:// URLs for lavinpy's own clients (the Spark data source, lavinpy-perf): the one parser.

parse_url splits amqp[s]://user:pass@host:port/vhost; user, password and vhost are percent-decoded
(%2F is "/"); an absent user or password is "guest", an absent or empty vhost is "/".

TLS options ride in the URL query with the names of RabbitMQ's URI spec: cacertfile, certfile,
keyfile, verify (verify_peer, the default, or verify_none) and server_name_indication.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

SCHEMES = {"amqp": 5672, "amqps": 5671}
_KEYS = ("cacertfile", "certfile", "keyfile", "verify", "server_name_indication")
# RabbitMQ's other URI query keys: a link (shovel, federation upstream) accepts them, so that RabbitMQ's
# definitions import as they are, and keeps its own heartbeat, timeouts and limits (docs/security.md).
RABBITMQ_OTHER_KEYS = ("heartbeat", "connection_timeout", "channel_max", "auth_mechanism", "fail_if_no_peer_cert",
                       "depth")
QUERY_KEYS = _KEYS + RABBITMQ_OTHER_KEYS  # every query key a link's URI may carry
FILE_KEYS = ("cacertfile", "certfile", "keyfile")  # the keys that name files of the machine
TLS_UNLOADABLE = "TLS settings could not be loaded"


@dataclass(frozen=True)
class TLSOptions:
    cacertfile: str = ""  # empty: the system's trusted CAs
    certfile: str = ""
    keyfile: str = ""
    verify: bool = True
    server_name: str = ""  # empty: the URL's host

    @classmethod
    def from_query(cls, query: str) -> TLSOptions:
        values = {}
        for key, items in parse_qs(query, keep_blank_values=True).items():
            if key not in _KEYS:
                continue  # other query keys (heartbeat, ...) belong to the caller
            values[key] = items[-1]
        verify = values.get("verify", "verify_peer")
        if verify not in ("verify_peer", "verify_none"):
            raise ValueError(f"verify={verify!r}: expected verify_peer or verify_none")
        if values.get("keyfile") and not values.get("certfile"):
            raise ValueError("keyfile needs certfile")
        return cls(cacertfile=values.get("cacertfile", ""), certfile=values.get("certfile", ""),
                   keyfile=values.get("keyfile", ""), verify=verify == "verify_peer",
                   server_name=values.get("server_name_indication", ""))

    def context(self) -> ssl.SSLContext:
        """A client context: TLS 1.2 or later, the server certificate checked unless verify_none."""
        ctx = ssl.create_default_context(cafile=self.cacertfile or None)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if not self.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.certfile:
            ctx.load_cert_chain(self.certfile, self.keyfile or None)
        return ctx


def default_port(scheme: str, url: str) -> int:
    """The port for amqp:// or amqps://; any other scheme is refused."""
    try:
        return SCHEMES[scheme]
    except KeyError:
        raise ValueError(f"unsupported URL scheme {scheme!r} in {url!r}: use amqp:// or amqps://") from None


@dataclass(frozen=True)
class AMQPURL:
    host: str = "127.0.0.1"
    port: int = 5672
    user: str = "guest"
    password: str = "guest"
    vhost: str = "/"
    tls: TLSOptions | None = None  # set for amqps:// only
    mechanism: str = "PLAIN"  # the SASL mechanism of the login (a node's own shovels use its internal one)


def parse_url(url: str) -> AMQPURL:
    """amqp[s]://user:pass@host:port/vhost; amqps:// takes the TLS query keys above (TLSOptions)."""
    u = urlsplit(url)
    port = default_port(u.scheme, url)
    path = u.path[1:] if u.path.startswith("/") else u.path
    return AMQPURL(host=u.hostname or "127.0.0.1", port=u.port or port,
                   user=unquote(u.username) if u.username is not None else "guest",
                   password=unquote(u.password) if u.password is not None else "guest",
                   vhost=unquote(path) if path else "/",
                   tls=TLSOptions.from_query(u.query) if u.scheme == "amqps" else None)


def load_tls(url: AMQPURL) -> AMQPURL:
    """The URL, once its TLS settings load (files read, context made); otherwise ValueError
    "TLS settings could not be loaded: <why>", on one line with no ";" (link errors join URIs with it)."""
    if url.tls is not None:
        try:
            url.tls.context()
        except (OSError, ValueError) as e:
            detail = " ".join(str(e).split()).replace(";", ",")
            raise ValueError(f"{TLS_UNLOADABLE}: {detail}") from None
    return url
