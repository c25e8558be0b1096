"""AMQPS EXTERNAL (RabbitMQ's rabbitmq_auth_mechanism_ssl): pika logs in with its client certificate,
the user name taken per ssl_cert_login_from (distinguished name, common name, alternative names); no
password; the user must exist; EXTERNAL offered only on TLS with a verified certificate."""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.credentials
import pika.exceptions
import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from .cert_login_broker import UPN, CertBroker, issue_client, utf8_string
from .conftest import lavinpy_only
from .tls_certs import CA

pytestmark = lavinpy_only("starts lavinpy with its own TLS settings")

SUBJECT = [(NameOID.COUNTRY_NAME, "SE"), (NameOID.ORGANIZATION_NAME, "Example, Inc"),
           (NameOID.COMMON_NAME, "device-1")]
DN = r"CN=device-1,O=Example\, Inc,C=SE"


@pytest.fixture
def cert_broker(tmp_path: Path) -> Iterator[CertBroker]:
    b = CertBroker(tmp_path)
    yield b
    b.close()


def _params(b: CertBroker, ctx: ssl.SSLContext) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(host="127.0.0.1", port=b.amqps_port, ssl_options=pika.SSLOptions(ctx, "localhost"),
                                     credentials=pika.credentials.ExternalCredentials(), connection_attempts=1,
                                     socket_timeout=10)


def _round_trip(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    queue = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", queue, b"certified")
    for _ in range(50):
        method, _, body = ch.basic_get(queue, auto_ack=True)
        if method is not None:
            assert body == b"certified"
            return
        time.sleep(0.05)
    raise AssertionError("the message did not come back")


def test_pika_logs_in_as_the_certificates_distinguished_name(cert_broker: CertBroker) -> None:
    b = cert_broker
    b.add_user(DN)
    cert, key = issue_client(b.ca, "device-1", SUBJECT)
    ctx = b.context(cert, key)
    assert b.mechanisms(ctx) == ["PLAIN", "AMQPLAIN", "EXTERNAL"]
    conn = pika.BlockingConnection(_params(b, ctx))
    try:
        _round_trip(conn)
        listed = [c for c in b.api("GET", "connections") if c["user"] == DN]  # type: ignore[union-attr]
        assert [(c["auth_mechanism"], c["ssl"], c["peer_cert_subject"] is not None) for c in listed] == \
            [("EXTERNAL", True, True)]
    finally:
        conn.close()


def test_external_is_offered_only_with_a_verified_certificate(cert_broker: CertBroker) -> None:
    b = cert_broker
    assert b.mechanisms(None) == ["PLAIN", "AMQPLAIN"]  # plain TCP
    assert b.mechanisms(b.context()) == ["PLAIN", "AMQPLAIN"]  # TLS without a client certificate
    # pika asking for EXTERNAL where it is not offered gets no login.
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(pika.ConnectionParameters(
            host="127.0.0.1", port=b.broker.port, credentials=pika.credentials.ExternalCredentials(),
            connection_attempts=1, socket_timeout=10))
    # PLAIN still works on the same listener.
    plain = pika.BlockingConnection(pika.ConnectionParameters(
        host="127.0.0.1", port=b.amqps_port, ssl_options=pika.SSLOptions(b.context(), "localhost"),
        credentials=pika.PlainCredentials("guest", "guest"), connection_attempts=1, socket_timeout=10))
    plain.close()


def test_a_certificate_whose_user_does_not_exist_is_refused_with_403(cert_broker: CertBroker) -> None:
    b = cert_broker
    cert, key = issue_client(b.ca, "stranger", [(NameOID.COMMON_NAME, "stranger")])
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as refused:
        pika.BlockingConnection(_params(b, b.context(cert, key)))
    assert "(403) 'ACCESS_REFUSED - Login was refused using authentication mechanism EXTERNAL" in str(refused.value)


def test_a_user_without_access_to_the_vhost_is_refused(cert_broker: CertBroker) -> None:
    b = cert_broker
    b.add_user("CN=no-access", vhost_access=False)
    cert, key = issue_client(b.ca, "no-access", [(NameOID.COMMON_NAME, "no-access")])
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as refused:
        pika.BlockingConnection(_params(b, b.context(cert, key)))
    assert "(530) \"NOT_ALLOWED - access to vhost '/' refused for user 'CN=no-access'\"" in str(refused.value)


def test_a_certificate_from_another_ca_is_refused_at_the_handshake(cert_broker: CertBroker, tmp_path: Path) -> None:
    b = cert_broker
    b.add_user("CN=device-1")
    other = CA(tmp_path / "other", name="another CA")
    cert, key = issue_client(other, "device-1", [(NameOID.COMMON_NAME, "device-1")])
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        b.mechanisms(b.context(cert, key))
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(_params(b, b.context(cert, key)))


def test_a_revoked_certificate_is_refused_at_the_handshake_and_others_still_log_in(tmp_path: Path) -> None:
    b = CertBroker(tmp_path, revoked=("device-revoked",))
    try:
        b.add_user("CN=device-revoked")
        b.add_user("CN=device-ok")
        cert, key = b.revoked["device-revoked"]
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            b.mechanisms(b.context(cert, key))
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(_params(b, b.context(cert, key)))
        good_cert, good_key = issue_client(b.ca, "device-ok", [(NameOID.COMMON_NAME, "device-ok")])
        with pika.BlockingConnection(_params(b, b.context(good_cert, good_key))) as conn:  # the CA's others
            conn.channel()
    finally:
        b.close()


@pytest.mark.parametrize(("settings", "user", "subject", "alt_names"), [
    ("ssl_cert_login_from: common_name\n", "device-1", SUBJECT, []),
    ("ssl_cert_login_from: subject_alternative_name\nssl_cert_login_san_type: email\n"
     "ssl_cert_login_san_index: 1\n", "second@example.com", SUBJECT,
     [x509.DNSName("d1.example.com"), x509.RFC822Name("first@example.com"), x509.RFC822Name("second@example.com")]),
    ("ssl_cert_login_from: subject_alternative_name\nssl_cert_login_san_type: dns\n", "d1.example.com", SUBJECT,
     [x509.RFC822Name("first@example.com"), x509.DNSName("d1.example.com")]),
    ("ssl_cert_login_from: subject_alt_name\nssl_cert_login_san_type: uri\n", "spiffe://example.com/app", SUBJECT,
     [x509.UniformResourceIdentifier("spiffe://example.com/app")]),
    ("ssl_cert_login_from: subject_alternative_name\nssl_cert_login_san_type: other_name\n", "app@EXAMPLE.COM",
     SUBJECT, [x509.OtherName(UPN, utf8_string("app@EXAMPLE.COM"))]),
], ids=["common_name", "san_email_index_1", "san_dns", "san_uri", "san_other_name"])
def test_user_names_from_the_certificate(tmp_path: Path, settings: str, user: str,
                                         subject: list[tuple[x509.ObjectIdentifier, str]],
                                         alt_names: list[x509.GeneralName]) -> None:
    b = CertBroker(tmp_path, settings)
    try:
        b.add_user(user)
        cert, key = issue_client(b.ca, "client", subject, alt_names)
        conn = pika.BlockingConnection(_params(b, b.context(cert, key)))
        try:
            _round_trip(conn)
            assert [c["user"] for c in b.api("GET", "connections")] == [user]  # type: ignore[union-attr]
        finally:
            conn.close()
        # The same certificate with the index past its names: no user name, refused.
        if "san_index: 1" in settings:
            short, short_key = issue_client(b.ca, "short", subject, alt_names[:2])
            with pytest.raises(pika.exceptions.ProbableAuthenticationError):
                pika.BlockingConnection(_params(b, b.context(short, short_key)))
            assert "no user name in the client certificate" in b.broker.log
    finally:
        b.close()
