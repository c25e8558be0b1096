"""Certificates for a cluster's TLS tests: one CA, and node certificates good as TLS server and client
both (a node serves replication when it leads and connects to the leader when it follows; etcd's
gateway also dials etcd itself with etcd's certificate), for 127.0.0.1 and localhost."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.e2e.tls_certs import CA


def node_certificate(ca: CA, name: str, common_name: bool = True) -> tuple[Path, Path]:
    """(certificate, key) paths of a certificate ``ca`` signs for ``name`` on loopback. Without
    ``common_name`` its subject is empty (etcd's gateway refuses a client certificate with one)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = [x509.NameAttribute(NameOID.COMMON_NAME, name)] if common_name else []
    cert = (ca.leaf(x509.Name(subject), key)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(ca.key, hashes.SHA256()))
    cert_path, key_path = ca.dir / f"{name}.pem", ca.dir / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path
