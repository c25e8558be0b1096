"""The HTTPS API with a client certificate (management_ssl_cert_login): a request without Basic
credentials acts as the certificate's user; a user that does not exist, one without a management tag,
or no certificate gets 401; a certificate from another CA is refused at the handshake."""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.x509.oid import NameOID

from .cert_login_broker import CertBroker, issue_client
from .conftest import lavinpy_only
from .tls_certs import CA

pytestmark = lavinpy_only("starts lavinpy with its own TLS settings")


@pytest.fixture
def cert_broker(tmp_path: Path) -> Iterator[CertBroker]:
    b = CertBroker(tmp_path, "ssl_cert_login_from: common_name\n")
    b.add_user("ops-console", tags="monitoring")
    b.add_user("worker")  # no management tag
    yield b
    b.close()


def _get(b: CertBroker, ctx: ssl.SSLContext, path: str, auth: str | None = None) -> tuple[int, Any]:
    headers = {} if auth is None else {"Authorization": auth}
    request = urllib.request.Request(f"https://localhost:{b.https_port}/api/{path}", headers=headers)
    try:
        with urllib.request.urlopen(request, context=ctx, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def test_a_client_certificate_logs_in_to_the_api(cert_broker: CertBroker) -> None:
    b = cert_broker
    cert, key = issue_client(b.ca, "ops", [(NameOID.COMMON_NAME, "ops-console")])
    status, body = _get(b, b.context(cert, key), "whoami")
    assert status == 200 and body["name"] == "ops-console" and body["tags"] == ["monitoring"]
    status, _ = _get(b, b.context(cert, key), "overview")
    assert status == 200
    # Basic credentials, when sent, take priority.
    guest = "Basic " + base64.b64encode(b"guest:guest").decode()
    assert _get(b, b.context(cert, key), "whoami", guest)[1]["name"] == "guest"
    assert _get(b, b.context(cert, key), "whoami", "Basic " + base64.b64encode(b"guest:x").decode())[0] == 401


def test_refusals_are_401(cert_broker: CertBroker) -> None:
    b = cert_broker
    stranger, stranger_key = issue_client(b.ca, "stranger", [(NameOID.COMMON_NAME, "stranger")])
    status, body = _get(b, b.context(stranger, stranger_key), "whoami")
    assert (status, body["error"]) == (401, "not_authorized")
    worker, worker_key = issue_client(b.ca, "worker", [(NameOID.COMMON_NAME, "worker")])
    status, body = _get(b, b.context(worker, worker_key), "whoami")
    assert (status, body["error"], body["reason"]) == (401, "not_authorised", "Not management user")
    status, body = _get(b, b.context(), "whoami")  # no certificate, no credentials
    assert (status, body["error"]) == (401, "not_authorized")


def test_a_certificate_from_another_ca_is_refused_at_the_handshake(cert_broker: CertBroker, tmp_path: Path) -> None:
    b = cert_broker
    other = CA(tmp_path / "other", name="another CA")
    cert, key = issue_client(other, "ops", [(NameOID.COMMON_NAME, "ops-console")])
    with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)):
        _get(b, b.context(cert, key), "whoami")


def test_switched_off_a_certificate_alone_gets_401(tmp_path: Path) -> None:
    b = CertBroker(tmp_path, "ssl_cert_login_from: common_name\nmanagement_ssl_cert_login: false\n")
    try:
        b.add_user("ops-console", tags="administrator")
        cert, key = issue_client(b.ca, "ops", [(NameOID.COMMON_NAME, "ops-console")])
        assert _get(b, b.context(cert, key), "whoami")[0] == 401
    finally:
        b.close()
