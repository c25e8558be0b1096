"""TLS contexts of a cluster node: for its etcd client, and for the replication port (the leader's
server side and the followers' client side, each verifying the other against the CA).

Only the standard library: lavinpyctl builds its etcd context here too.
"""

from __future__ import annotations

import ssl
from typing import Any


class ClusterTLSError(OSError):
    """A certificate, key or CA file of the cluster settings cannot be used."""


def _load(ctx: ssl.SSLContext, ca: str, cert: str, key: str, what: str) -> ssl.SSLContext:
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca:
        try:
            ctx.load_verify_locations(cafile=ca)
        except (OSError, ssl.SSLError) as e:
            raise ClusterTLSError(f"{what}: cannot load the CA file {ca}: {getattr(e, 'strerror', None) or e}")
    if cert:
        try:
            ctx.load_cert_chain(cert, key or None)
        except (OSError, ssl.SSLError) as e:
            raise ClusterTLSError(f"{what}: cannot load the certificate {cert} / key {key}: "
                                  f"{getattr(e, 'strerror', None) or e}")
    return ctx


def etcd_context(ca: str = "", cert: str = "", key: str = "") -> ssl.SSLContext:
    """A client context for etcd's https endpoints: etcd's certificate checked against ``ca`` (the
    system's CAs when empty) and its host name; ``cert``/``key`` presented when etcd asks for one."""
    ctx = ssl.create_default_context() if not ca else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    return _load(ctx, ca, cert, key, "etcd TLS")


def replication_server_context(cert: str, key: str, ca: str) -> ssl.SSLContext:
    """The leader's side: its certificate, and a follower must present one that ``ca`` signed."""
    ctx = _load(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), ca, cert, key, "replication TLS")
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def replication_client_context(cert: str, key: str, ca: str) -> ssl.SSLContext:
    """A follower's side: the leader's certificate must chain to ``ca`` and name the host of its
    advertised URI; this node's certificate is presented."""
    return _load(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), ca, cert, key, "replication TLS")


def node_contexts(config: Any) -> tuple[ssl.SSLContext | None, tuple[ssl.SSLContext, ssl.SSLContext] | None]:
    """A node's contexts from its settings (lavinpy.config.Config): for etcd (None: plain HTTP), and
    the replication port's server and client sides (None: plain TCP). ClusterTLSError names a file
    that cannot be used."""
    etcd = None
    if config.clustering_etcd_tls:
        etcd = etcd_context(config.clustering_etcd_tls_ca, config.clustering_etcd_tls_cert,
                            config.clustering_etcd_tls_key)
    replication = None
    if config.clustering_tls:
        replication = (replication_server_context(config.tls_cert, config.tls_key, config.tls_ca_cert),
                       replication_client_context(config.tls_cert, config.tls_key, config.tls_ca_cert))
    return etcd, replication
