"""The LDAP backend's TLS checks a directory's certificate against the name it was given, an IP address
included (ldap3's own check knows no IP address on Python 3.12 and later), with the directory's CA."""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from lavinpy.broker.access.ldap_backend import directory_tls
from tests.e2e.tls_certs import CA
from tests.helpers import serving


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> CA:
    return CA(tmp_path_factory.mktemp("pki"))


def _tls_server(ca: CA, address: str) -> Iterator[int]:
    """A TLS server on ``address`` with a certificate for localhost and 127.0.0.1: it does handshakes only."""
    cert, key, _ = ca.issue("directory", server=True)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)

    def handshake(conn: socket.socket) -> None:
        conn.settimeout(5)
        try:
            with context.wrap_socket(conn, server_side=True) as tls:
                tls.recv(1)
        except (OSError, ssl.SSLError):
            conn.close()

    with serving(address, handshake) as port:
        yield port


@pytest.fixture
def on_127_0_0_1(ca: CA) -> Iterator[int]:
    yield from _tls_server(ca, "127.0.0.1")


@pytest.fixture
def on_127_0_0_2(ca: CA) -> Iterator[int]:
    yield from _tls_server(ca, "127.0.0.2")


def _handshake(host: str, port: int, cacertfile: Path) -> None:
    """What ldap3 does for LDAPS and STARTTLS: its Tls wraps the connection's socket, handshake included."""
    connection = SimpleNamespace(socket=socket.create_connection((host, port), timeout=5),
                                 server=SimpleNamespace(host=host))
    try:
        directory_tls(str(cacertfile)).wrap_socket(connection, do_handshake=True)
    finally:
        connection.socket.close()


def test_a_directory_named_by_its_address_is_reached(ca: CA, on_127_0_0_1: int) -> None:
    _handshake("127.0.0.1", on_127_0_0_1, ca.cert_path)


def test_a_certificate_for_another_address_is_refused(ca: CA, on_127_0_0_2: int) -> None:
    with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
        _handshake("127.0.0.2", on_127_0_0_2, ca.cert_path)


def test_a_certificate_from_another_ca_is_refused(on_127_0_0_1: int, tmp_path: Path) -> None:
    with pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):
        _handshake("127.0.0.1", on_127_0_0_1, CA(tmp_path / "other").cert_path)


def test_a_fifo_as_the_directorys_ca_file_is_refused_at_once(on_127_0_0_1: int, tmp_path: Path) -> None:
    fifo = tmp_path / "ca-fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="is not a regular file"):
        _handshake("127.0.0.1", on_127_0_0_1, fifo)
