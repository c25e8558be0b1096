"""amqp:// and amqps:// URLs for lavinpy's own clients (the Spark data source, lavinpy-perf): schemes, ports, TLS.

TLS options ride in the URL query with the names of RabbitMQ's URI spec: cacertfile, certfile,
keyfile, verify (verify_peer, the default, or verify_none) and server_name_indication.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from urllib.parse import parse_qs

SCHEMES = {"amqp": 5672, "amqps": 5671}
_KEYS = ("cacertfile", "certfile", "keyfile", "verify", "server_name_indication")


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
