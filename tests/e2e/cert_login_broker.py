"""A broker with client-certificate logins on (AMQPS EXTERNAL, MQTTS ssl_cert_login, HTTPS), its CA,
client certificates with chosen subjects and alternative names, and users made through the API."""

from __future__ import annotations

import base64
import socket
import ssl
import time
import urllib.parse
import urllib.request
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from pamqp import commands, frame

from tests.helpers import free_port, http_json

from .conftest import LocalBroker, port_open
from .tls_certs import CA

GUEST = "Basic " + base64.b64encode(b"guest:guest").decode()
UPN = x509.ObjectIdentifier("1.3.6.1.4.1.311.20.2.3")  # Microsoft's user principal name


def issue_client(ca: CA, name: str, subject: list[tuple[x509.ObjectIdentifier, str]],
                 alt_names: list[x509.GeneralName] | None = None) -> tuple[Path, Path]:
    """A client certificate signed by ``ca`` with this subject (RDNs in order) and alternative names."""
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (ca.leaf(x509.Name([x509.NameAttribute(oid, value) for oid, value in subject]), key)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
    if alt_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
    cert = builder.sign(ca.key, hashes.SHA256())
    cert_path, key_path = ca.dir / f"{name}.pem", ca.dir / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def utf8_string(text: str) -> bytes:
    """A short DER UTF8String (an otherName's value)."""
    raw = text.encode()
    return bytes([0x0C, len(raw)]) + raw


class CertBroker:
    def __init__(self, tmp_path: Path, settings: str = "", revoked: tuple[str, ...] = ()) -> None:
        """``revoked``: client certificates (common names) issued and revoked by the CA's list (tls_crl_file)."""
        self.ca = CA(tmp_path / "pki")
        self.cert, self.key, _ = self.ca.issue("server", server=True)
        self.revoked = {name: self.ca.issue(name, server=False)[:2] for name in revoked}
        if revoked:
            serials = [x509.load_pem_x509_certificate(cert.read_bytes()).serial_number
                       for cert, _ in self.revoked.values()]
            settings += f"tls_crl_file: {self.ca.crl(serials)}\n"
        self.amqps_port, self.mqtts_port, self.https_port = free_port(), free_port(), free_port()
        conf = tmp_path / "certs.yaml"
        conf.write_text(f"tls_cert: {self.cert}\ntls_key: {self.key}\ntls_ca_cert: {self.ca.cert_path}\n"
                        "tls_verify_peer: true\nauth_mechanisms: [PLAIN, AMQPLAIN, EXTERNAL]\n"
                        "mqtt_ssl_cert_login: true\nmanagement_ssl_cert_login: true\nmqtt_allow_anonymous: false\n"
                        f"amqps_port: {self.amqps_port}\nmqtts_port: {self.mqtts_port}\n"
                        f"https_port: {self.https_port}\nprometheus_tls_port: 0\n{settings}")
        self.broker = LocalBroker(tmp_path / "broker")
        self.mqtt_port = free_port()
        self.broker.extra_args = ["--config", str(conf), "--mqtt-port", str(self.mqtt_port),
                                  "--mqtts-port", str(self.mqtts_port)]
        self.broker.start()
        deadline = time.monotonic() + 10
        for port in (self.amqps_port, self.mqtts_port, self.https_port):
            while not port_open("127.0.0.1", port):
                assert time.monotonic() < deadline, f"no TLS listener on {port}:\n{self.broker.log[-3000:]}"
                time.sleep(0.05)

    def close(self) -> None:
        self.broker.close()

    def api(self, method: str, path: str, body: object = None) -> object:
        return http_json(f"http://127.0.0.1:{self.broker.http_port}/api/{path}", method, body, authorization=GUEST)

    def add_user(self, name: str, tags: str = "", vhost_access: bool = True) -> None:
        quoted = urllib.parse.quote(name, safe="")
        self.api("PUT", f"users/{quoted}", {"password_hash": "", "tags": tags})
        if vhost_access:
            self.api("PUT", f"permissions/%2F/{quoted}", {"configure": ".*", "write": ".*", "read": ".*"})

    def context(self, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca.cert_path))
        if cert is not None:
            ctx.load_cert_chain(str(cert), str(key))
        return ctx

    def mechanisms(self, ctx: ssl.SSLContext | None) -> list[str]:
        """The mechanisms of Connection.Start on AMQPS (with ``ctx``) or plain AMQP (None)."""
        port = self.broker.port if ctx is None else self.amqps_port
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            sock = raw if ctx is None else ctx.wrap_socket(raw, server_hostname="localhost")
            sock.sendall(b"AMQP\x00\x00\x09\x01")
            data = b""
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    raise ConnectionError("the broker closed the connection")
                data += chunk
                try:
                    _, _, start = frame.unmarshal(data)
                    break
                except Exception:
                    continue
            assert isinstance(start, commands.Connection.Start)
            return str(start.mechanisms).split()
