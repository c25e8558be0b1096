"""amqp:// and amqps:// URLs for lavinpy's own clients (the Spark data source, lavinpy-perf): the one parser.

parse_url splits amqp[s]://user:pass@host:port/vhost; user, password and vhost are percent-decoded
(%2F is "/"); an absent user or password is "guest", an absent or empty vhost is "/".

TLS options ride in the URL query with the names of RabbitMQ's URI spec: cacertfile, certfile,
keyfile, password (the keyfile's passphrase), verify (verify_peer, the default, or verify_none) and
server_name_indication. So do the connection's own settings, read as RabbitMQ's Erlang client reads
them: heartbeat (seconds, 0 for none), connection_timeout (milliseconds), channel_max, frame_max and
auth_mechanism (plain, amqplain or external; given more than once, the first the broker offers). Any
other key is refused: ignored, a misspelt one would leave its default in force without a word.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

from .tls_keys import load_cert_chain, regular_file

SCHEMES = {"amqp": 5672, "amqps": 5671}
_KEYS = ("cacertfile", "certfile", "keyfile", "password", "verify", "server_name_indication")
TUNING_KEYS = ("heartbeat", "connection_timeout", "channel_max", "frame_max", "auth_mechanism")
# Keys RabbitMQ's URI spec names that a client side of ours has no use for: accepted, so that RabbitMQ's
# definitions import as they are (a server-side TLS setting, and the chain depth OpenSSL bounds itself).
IGNORED_KEYS = ("fail_if_no_peer_cert", "depth")
QUERY_KEYS = _KEYS + TUNING_KEYS + IGNORED_KEYS  # every query key a URI may carry
FILE_KEYS = ("cacertfile", "certfile", "keyfile")  # the keys that name files of the machine
TLS_UNLOADABLE = "TLS settings could not be loaded"


@dataclass(frozen=True)
class TLSOptions:
    cacertfile: str = ""  # empty: the system's trusted CAs
    certfile: str = ""
    keyfile: str = ""
    password: str = field(default="", repr=False)  # the keyfile's passphrase (an encrypted key)
    verify: bool = True
    server_name: str = ""  # empty: the URL's host

    @classmethod
    def from_query(cls, query: str) -> TLSOptions:
        values = {}
        for key, items in parse_qs(query, keep_blank_values=True).items():
            if key not in _KEYS:
                continue  # the connection's own keys (heartbeat, ...) are Tuning's
            values[key] = items[-1]
        verify = values.get("verify", "verify_peer")
        if verify not in ("verify_peer", "verify_none"):
            raise ValueError(f"verify={verify!r}: expected verify_peer or verify_none")
        if values.get("keyfile") and not values.get("certfile"):
            raise ValueError("keyfile needs certfile")
        return cls(cacertfile=values.get("cacertfile", ""), certfile=values.get("certfile", ""),
                   keyfile=values.get("keyfile", ""), password=values.get("password", ""),
                   verify=verify == "verify_peer",
                   server_name=values.get("server_name_indication", ""))

    def context(self) -> ssl.SSLContext:
        """A client context: TLS 1.2 or later, the server certificate checked unless verify_none."""
        ctx = ssl.create_default_context(cafile=regular_file(self.cacertfile) or None)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if not self.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.certfile:
            load_cert_chain(ctx, self.certfile, self.keyfile, self.password, "the URI's password key")
        return ctx


def default_port(scheme: str, url: str) -> int:
    """The port for amqp:// or amqps://; any other scheme is refused."""
    try:
        return SCHEMES[scheme]
    except KeyError:
        raise ValueError(f"unsupported URL scheme {scheme!r} in {url!r}: use amqp:// or amqps://") from None


# auth_mechanism's values (RabbitMQ's names) and the SASL mechanisms they stand for. The node's internal
# mechanism is not among them: a URI can never ask for it.
URI_MECHANISMS = {"plain": "PLAIN", "amqplain": "AMQPLAIN", "external": "EXTERNAL"}


@dataclass(frozen=True)
class Tuning:
    """A URI's connection settings; None where the URI leaves them to the client."""

    heartbeat: int | None = None  # seconds; 0: none
    connection_timeout: float | None = None  # seconds (the URI gives milliseconds)
    channel_max: int | None = None
    frame_max: int | None = None
    mechanisms: tuple[str, ...] = ()  # SASL names, in the order given

    @classmethod
    def from_query(cls, query: str) -> Tuning:
        """The settings of a URI's query, or ValueError naming the key and what it takes."""
        items = parse_qs(query, keep_blank_values=True)

        def whole(key: str, low: int, high: int) -> int | None:
            if key not in items:
                return None
            text = items[key][-1]
            if not text.strip().isdigit() or not low <= int(text) <= high:
                raise ValueError(f"{key}={text!r}: expected a whole number from {low} to {high}")
            return int(text)

        mechanisms = []
        for name in items.get("auth_mechanism", []):
            if name.lower() not in URI_MECHANISMS:
                raise ValueError(f"auth_mechanism={name!r}: expected {', '.join(URI_MECHANISMS)}")
            mechanisms.append(URI_MECHANISMS[name.lower()])
        timeout = whole("connection_timeout", 1, 2**32 - 1)
        frame_max = whole("frame_max", 0, 2**32 - 1)
        if frame_max and frame_max < 4096:  # AMQP's smallest frame (0: the broker's largest)
            raise ValueError(f"frame_max={frame_max}: expected 0 or a whole number from 4096")
        return cls(heartbeat=whole("heartbeat", 0, 65535), channel_max=whole("channel_max", 0, 65535),
                   frame_max=frame_max,
                   connection_timeout=None if timeout is None else timeout / 1000, mechanisms=tuple(mechanisms))


@dataclass(frozen=True)
class AMQPURL:
    host: str = "127.0.0.1"
    port: int = 5672
    user: str = "guest"
    password: str = "guest"
    vhost: str = "/"
    tls: TLSOptions | None = None  # set for amqps:// only
    mechanism: str = "PLAIN"  # the SASL mechanism of the login (a node's own shovels use its internal one)
    tuning: Tuning = Tuning()


def unknown_keys(query: str) -> str | None:
    """Why a URI's query is refused, or None: keys this parser does not take (a misspelt key would
    otherwise leave its default in force without a word)."""
    unknown = sorted({key for key in parse_qs(query, keep_blank_values=True) if key not in QUERY_KEYS})
    if not unknown:
        return None
    return ("unknown URI query key(s) " + ", ".join(f"'{k}'" for k in unknown)
            + "; should be one of: " + ", ".join(f"'{k}'" for k in QUERY_KEYS))


def parse_url(url: str) -> AMQPURL:
    """amqp[s]://user:pass@host:port/vhost; amqps:// takes the TLS query keys above (TLSOptions), either
    scheme the connection's (Tuning; ``mechanism`` is the first auth_mechanism given). A query key
    RabbitMQ's URI spec does not name is refused (ValueError)."""
    u = urlsplit(url)
    port = default_port(u.scheme, url)
    refusal = unknown_keys(u.query)
    if refusal:
        raise ValueError(refusal)
    path = u.path[1:] if u.path.startswith("/") else u.path
    tuning = Tuning.from_query(u.query)
    return AMQPURL(tuning=tuning, mechanism=tuning.mechanisms[0] if tuning.mechanisms else "PLAIN",
                   host=u.hostname or "127.0.0.1", port=u.port or port,
                   user=unquote(u.username) if u.username is not None else "guest",
                   password=unquote(u.password) if u.password is not None else "guest",
                   vhost=unquote(path) if path else "/",
                   tls=TLSOptions.from_query(u.query) if u.scheme == "amqps" else None)


SECRET_KEYS = ("password",)  # query keys whose values are secrets (the keyfile's passphrase)


def shown_uri(uri: str, mask: str | None = "***") -> str:
    """The URI as statuses and logs show it: the password of its user info and the values of its
    secret query keys replaced by ``mask``, or dropped when it is None (the rest as written). A string
    that does not parse as a URI is returned as it is (its parser refuses it)."""
    try:
        u = urlsplit(uri)
        has_password = u.password is not None
    except ValueError:
        return uri
    netloc = u.netloc
    if has_password:
        userinfo, _, hostport = netloc.rpartition("@")
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:{mask}@{hostport}" if mask is not None else f"{user}@{hostport}" if user else hostport
    query = u.query
    if any(key in query for key in SECRET_KEYS):
        parts = []
        for part in query.split("&"):
            if part.split("=", 1)[0] in SECRET_KEYS:
                if mask is None:
                    continue
                part = f"{part.split('=', 1)[0]}={mask}"
            parts.append(part)
        query = "&".join(parts)
    if netloc == u.netloc and query == u.query:
        return uri  # nothing secret: as written (a local "amqp://" would lose its slashes in urlunsplit)
    return urlunsplit((u.scheme, netloc, u.path, query, u.fragment))


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
