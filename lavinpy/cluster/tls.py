"""TLS contexts of a cluster node: for its etcd client, and for the replication port (the leader's
server side and the followers' client side, each verifying the other against the CA).

Only the standard library: lavinpyctl builds its etcd context here too.
"""

from __future__ import annotations

import ssl
from typing import Any

from ..wire.tls_keys import KeyPasswordError, load_cert_chain, regular_file


class ClusterTLSError(OSError):
    """A certificate, key or CA file of the cluster settings cannot be used."""


def _load(ctx: ssl.SSLContext, ca: str, cert: str, key: str, what: str,
          key_password: tuple[str, str]) -> ssl.SSLContext:
    """key_password: an encrypted key's passphrase and the setting that gives it."""
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca:
        try:
            ctx.load_verify_locations(cafile=regular_file(ca))
        except (OSError, ssl.SSLError) as e:
            raise ClusterTLSError(f"{what}: cannot load the CA file {ca}: {getattr(e, 'strerror', None) or e}")
    if cert:
        try:
            load_cert_chain(ctx, cert, key, *key_password)
        except (OSError, ssl.SSLError, KeyPasswordError) as e:
            raise ClusterTLSError(f"{what}: cannot load the certificate {cert} / key {key}: "
                                  f"{getattr(e, 'strerror', None) or e}")
    return ctx


def etcd_context(ca: str = "", cert: str = "", key: str = "", key_password: str = "") -> ssl.SSLContext:
    """A client context for etcd's https endpoints: etcd's certificate checked against ``ca`` (the
    system's CAs when empty) and its host name; ``cert``/``key`` presented when etcd asks for one
    (``key_password``: clustering_etcd_tls_key_password, the key's passphrase when it is encrypted)."""
    ctx = ssl.create_default_context() if not ca else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    return _load(ctx, ca, cert, key, "etcd TLS", (key_password, "clustering_etcd_tls_key_password"))


def replication_server_context(cert: str, key: str, ca: str, key_password: str = "") -> ssl.SSLContext:
    """The leader's side: its certificate, and a follower must present one that ``ca`` signed."""
    ctx = _load(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), ca, cert, key, "replication TLS",
                (key_password, "tls_key_password"))
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def replication_client_context(cert: str, key: str, ca: str, key_password: str = "") -> ssl.SSLContext:
    """A follower's side: the leader's certificate must chain to ``ca`` and name the host of its
    advertised URI; this node's certificate is presented."""
    return _load(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), ca, cert, key, "replication TLS",
                 (key_password, "tls_key_password"))


def node_contexts(config: Any) -> tuple[ssl.SSLContext | None, tuple[ssl.SSLContext, ssl.SSLContext] | None]:
    """A node's contexts from its settings (lavinpy.config.Config): for etcd (None: plain HTTP), and
    the replication port's server and client sides (None: plain TCP). ClusterTLSError names a file
    that cannot be used."""
    etcd = None
    if config.clustering_etcd_tls:
        etcd = etcd_context(config.clustering_etcd_tls_ca, config.clustering_etcd_tls_cert,
                            config.clustering_etcd_tls_key, config.clustering_etcd_tls_key_password)
    replication = None
    if config.clustering_tls:
        files = (config.tls_cert, config.tls_key, config.tls_ca_cert, config.tls_key_password)
        replication = (replication_server_context(*files), replication_client_context(*files))
    return etcd, replication
