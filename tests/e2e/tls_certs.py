"""A throwaway CA and certificates for the TLS tests (made with the cryptography package).

The certificates carry the key identifiers RFC 5280 asks for (a subject key identifier on each, an
authority key identifier on those the CA signs) and the CA's key usage: Python 3.13's default client
context checks them strictly (VERIFY_X509_STRICT) and refuses a certificate without them."""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


class CA:
    def __init__(self, directory: Path, name: str = "lavinpy test CA") -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = dt.datetime.now(dt.UTC)
        self.cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                                  key_encipherment=False, data_encipherment=False, key_agreement=False,
                                                  key_cert_sign=True, crl_sign=True, encipher_only=False,
                                                  decipher_only=False), critical=True)
                     .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
                     .sign(self.key, hashes.SHA256()))
        self.cert_path = self.dir / f"{name.replace(' ', '_')}.pem"
        self.cert_path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def leaf(self, subject: x509.Name, key: ec.EllipticCurvePrivateKey, serial: int | None = None
             ) -> x509.CertificateBuilder:
        """A builder of a certificate this CA signs for ``key``, valid now for a day, with its key identifiers."""
        now = dt.datetime.now(dt.UTC)
        return (x509.CertificateBuilder().subject_name(subject).issuer_name(self.cert.subject)
                .public_key(key.public_key()).serial_number(serial or x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                               critical=False))

    def issue(self, name: str, *, server: bool, serial: int | None = None) -> tuple[Path, Path, int]:
        """A certificate (for 127.0.0.1 / localhost when server) and its key; returns paths and serial."""
        key = ec.generate_private_key(ec.SECP256R1())
        serial = serial or x509.random_serial_number()
        builder = (self.leaf(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]), key, serial)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server
                                                         else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        cert_path, key_path = self.dir / f"{name}.pem", self.dir / f"{name}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        return cert_path, key_path, serial

    def crl(self, revoked: list[int]) -> Path:
        """A certificate revocation list of this CA revoking the certificates of these serials."""
        now = dt.datetime.now(dt.UTC)
        builder = (x509.CertificateRevocationListBuilder().issuer_name(self.cert.subject)
                   .last_update(now - dt.timedelta(minutes=5)).next_update(now + dt.timedelta(days=1)))
        for serial in revoked:
            builder = builder.add_revoked_certificate(
                x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(now - dt.timedelta(minutes=1))
                .build())
        path = self.dir / "revoked.crl.pem"
        path.write_bytes(builder.sign(self.key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
        return path


def encrypted(key: Path, passphrase: str) -> Path:
    """The private key at ``key`` written beside it as encrypted PEM (PKCS#8 with ``passphrase``)."""
    loaded = serialization.load_pem_private_key(key.read_bytes(), None)
    out = key.with_suffix(".enc.key")
    out.write_bytes(loaded.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                         serialization.BestAvailableEncryption(passphrase.encode())))
    return out
