"""The user name of a verified client certificate, as RabbitMQ's ``ssl_cert_login_from`` takes it.

Only a certificate the TLS handshake verified against ``tls_ca_cert`` is used: with
``tls_verify_peer`` the server asks for one and refuses the handshake when it does not verify, so a
certificate the connection holds is a verified one (``peer_certificate`` returns None otherwise).

- ``distinguished_name``: the subject in RabbitMQ's RFC 4514 form: the RDNs last first, joined by
  ``,`` (multi-valued ones by ``+``), short attribute names (CN, O, OU, C, L, ST, DC, UID,
  EMAILADDRESS, ...), ``,+"\\<>;`` and a leading ``#`` or space and a trailing space escaped with a
  backslash, other non-printable or non-ASCII bytes as ``\\XX``;
- ``common_name``: the subject's CN (several are joined by ``,``);
- ``subject_alternative_name`` (or ``subject_alt_name``): the ``ssl_cert_login_san_index``-th
  (0-based) name of type ``ssl_cert_login_san_type`` (dns, ip, email, uri, other_name; an otherName's
  string value, read with the cryptography package).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ...config import Config

log = logging.getLogger("lavinpy.login")

# getpeercert()'s attribute names (OpenSSL's long names) -> RabbitMQ's short names
_SHORT = {"surname": "SN", "givenName": "GIVENNAME", "initials": "INITIALS",
          "generationQualifier": "GENERATIONQUALIFIER", "commonName": "CN", "localityName": "L",
          "stateOrProvinceName": "ST", "organizationName": "O", "organizationalUnitName": "OU", "title": "TITLE",
          "countryName": "C", "serialNumber": "SERIALNUMBER", "pseudonym": "PSEUDONYM", "domainComponent": "DC",
          "emailAddress": "EMAILADDRESS", "streetAddress": "STREET", "userId": "UID"}
# getpeercert()'s subjectAltName types
_SAN_TYPES = {"dns": "DNS", "ip": "IP Address", "email": "email", "uri": "URI"}


@dataclass(frozen=True, slots=True)
class PeerCertificate:
    """A verified client certificate: ``getpeercert()``'s fields and the DER bytes."""

    fields: dict[str, Any]
    der: bytes


def peer_certificate(ssl_object: Any) -> PeerCertificate | None:
    """The verified certificate of a TLS connection (an ``ssl.SSLObject`` or ``SSLSocket``), or None."""
    if ssl_object is None:
        return None
    try:
        fields = ssl_object.getpeercert()
        der = ssl_object.getpeercert(binary_form=True)
    except ValueError:  # the handshake is not done
        return None
    if not fields or not der:  # none sent, or not asked for (then it was not verified either)
        return None
    return PeerCertificate(fields, der)


def certificate_login(enabled: bool, config: Config, cert: PeerCertificate | None) -> str | None:
    """The user of a certificate login on a face where it is ``enabled``: None when it is off, the
    client sent no verified certificate, or the certificate has no user name (logged)."""
    if not enabled or cert is None:
        return None
    user = certificate_user(config, cert)
    if user is None:
        log.warning("no user name in the client certificate (ssl_cert_login_from: %s, subject %s)",
                    config.ssl_cert_login_from, distinguished_name(cert.fields.get("subject") or ()))
    return user


def certificate_user(config: Config, cert: PeerCertificate) -> str | None:
    """The user name ``ssl_cert_login_from`` takes from ``cert``, or None when it has none."""
    source = config.ssl_cert_login_from
    subject = cert.fields.get("subject") or ()
    if source == "distinguished_name":
        return distinguished_name(subject) or None
    if source == "common_name":
        names = [value for rdn in subject for key, value in rdn if key == "commonName"]
        return ",".join(names) or None
    san_type, index = config.ssl_cert_login_san_type, config.ssl_cert_login_san_index
    if san_type == "other_name":
        values = _other_names(cert.der)
    else:
        kind = _SAN_TYPES[san_type]
        values = [value for key, value in cert.fields.get("subjectAltName") or () if key == kind]
    return values[index] if index < len(values) else None


def distinguished_name(subject: Any) -> str:
    """A subject (getpeercert()'s tuple of RDNs) in RabbitMQ's RFC 4514 string form."""
    return ",".join("+".join(f"{_SHORT.get(key, key)}={_escape(value)}" for key, value in rdn)
                    for rdn in reversed(tuple(subject)))


def _escape(value: str) -> str:
    out = []
    last = len(value) - 1
    for i, char in enumerate(value):
        if (i == 0 and char in " #") or (i == last and char == " ") or char in ',+"\\<>;':
            out.append("\\" + char)
        elif " " <= char < "\x7e":
            out.append(char)
        else:
            out.extend(f"\\{byte:02X}" for byte in char.encode("utf-8"))
    return "".join(out)


def _other_names(der: bytes) -> list[str]:
    """The string values of the certificate's otherName SANs (a value that is no string: its hex)."""
    try:
        from cryptography import x509  # checked to be there when other_name is set
        from cryptography.x509.oid import ExtensionOID
    except ImportError:
        return []
    try:
        san = x509.load_der_x509_certificate(der).extensions.get_extension_for_oid(
            ExtensionOID.SUBJECT_ALTERNATIVE_NAME).value
    except (ValueError, x509.ExtensionNotFound):
        return []
    if not isinstance(san, x509.SubjectAlternativeName):
        return []
    return [_der_string(name.value) for name in san.get_values_for_type(x509.OtherName)]


def _der_string(value: bytes) -> str:
    """A DER string value (UTF8String, PrintableString, IA5String, ...) as text; else its hex."""
    if len(value) >= 2 and value[0] in (0x0C, 0x13, 0x16, 0x14, 0x1A) and value[1] < 0x80 \
            and len(value) == 2 + value[1]:
        return value[2:].decode("utf-8", "replace")
    return value.hex()
