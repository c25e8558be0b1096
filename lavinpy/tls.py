"""TLS for the AMQPS listener: the server context, client certificates, reload on SIGHUP.

A reload builds a whole new context from the files; the listener's context hands each new
handshake to the newest one (from the server-name callback, which OpenSSL calls for every
ClientHello, with or without SNI). Established connections keep the certificate they started with.
"""

from __future__ import annotations

import logging
import ssl

from .config import Config
from .wire.tls_keys import KeyPasswordError, load_cert_chain, regular_file

log = logging.getLogger("lavinpy")


class TLSConfigError(OSError):
    """A certificate, key or CA file cannot be used."""


def build_context(config: Config) -> ssl.SSLContext:
    """A server context from tls_cert / tls_key / tls_ca_cert: TLS 1.2 or later."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        load_cert_chain(ctx, config.tls_cert, config.tls_key, config.tls_key_password, "tls_key_password")
    except (OSError, ssl.SSLError, KeyPasswordError) as e:
        raise TLSConfigError(f"cannot load tls_cert {config.tls_cert} / tls_key {config.tls_key}: "
                             f"{getattr(e, 'strerror', None) or e}")
    if config.tls_ca_cert:
        try:
            ctx.load_verify_locations(cafile=regular_file(config.tls_ca_cert))
        except (OSError, ssl.SSLError) as e:
            raise TLSConfigError(f"cannot load tls_ca_cert {config.tls_ca_cert}: "
                                 f"{getattr(e, 'strerror', None) or e}")
    if config.tls_crl_file:  # the client certificate (the leaf) is checked against the CA's lists
        try:
            ctx.load_verify_locations(cafile=regular_file(config.tls_crl_file))
        except (OSError, ssl.SSLError) as e:
            raise TLSConfigError(f"cannot load tls_crl_file {config.tls_crl_file}: "
                                 f"{getattr(e, 'strerror', None) or e}")
        ctx.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF
    if config.tls_verify_peer:
        ctx.verify_mode = ssl.CERT_REQUIRED if config.tls_fail_if_no_peer_cert else ssl.CERT_OPTIONAL
    return ctx


class ServerTLS:
    """The AMQPS listener's context, and the newest one loaded from the files."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.listener_context = build_context(config)
        self.current = self.listener_context
        self.listener_context.sni_callback = self._use_current

    def reload(self) -> None:
        """Read the files again; on an error the running certificate stays (and the error is raised)."""
        self.current = build_context(self.config)

    def _use_current(self, sslobj: ssl.SSLObject, server_name: str | None, ctx: ssl.SSLContext) -> None:
        if self.current is not ctx:
            sslobj.context = self.current
