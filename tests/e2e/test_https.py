"""The management API and /metrics over TLS (https_port, prometheus_tls_port) with the AMQPS
certificate settings: real HTTPS clients (urllib with the test CA, Debian's rabbitmqadmin --ssl), plain
HTTP turned off, and a new certificate after SIGHUP for new connections only."""

from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import free_port

from .conftest import LocalBroker, lavinpy_only, port_open
from .tls_certs import CA

pytestmark = lavinpy_only("starts lavinpy with its own TLS settings")

AUTH = "Basic " + base64.b64encode(b"guest:guest").decode()


class HTTPSBroker:
    """A broker whose API answers only over HTTPS (http_port 0) and whose metrics answer on both ports."""

    def __init__(self, tmp_path: Path) -> None:
        self.ca = CA(tmp_path / "pki")
        self.cert, self.key, self.serial = self.ca.issue("server", server=True)
        self.https_port, self.metrics_tls_port = free_port(), free_port()
        conf = tmp_path / "https.yaml"
        conf.write_text(f"tls_cert: {self.cert}\ntls_key: {self.key}\namqps_port: 0\nmqtts_port: 0\n"
                        f"https_port: {self.https_port}\nprometheus_tls_port: {self.metrics_tls_port}\n")
        self.broker = LocalBroker(tmp_path / "broker")
        self.plain_http_port = self.broker.http_port  # stays closed: http_port 0 below wins
        self.broker.http_port = self.https_port  # what the start waits for
        self.broker.extra_args = ["--config", str(conf), "--http-port", "0"]
        self.broker.start()
        deadline = time.monotonic() + 10
        while not port_open("127.0.0.1", self.metrics_tls_port):
            assert time.monotonic() < deadline, f"no Prometheus TLS listener:\n{self.broker.log[-3000:]}"
            time.sleep(0.05)

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca.cert_path))

    def get(self, port: int, path: str) -> tuple[int, bytes]:
        request = urllib.request.Request(f"https://localhost:{port}{path}", headers={"Authorization": AUTH})
        try:
            with urllib.request.urlopen(request, context=self.context(), timeout=10) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def served_serial(self, port: int) -> int:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                self.context().wrap_socket(raw, server_hostname="localhost") as tls:
            return int(tls.getpeercert()["serialNumber"], 16)


@pytest.fixture
def https_broker(tmp_path: Path) -> Iterator[HTTPSBroker]:
    b = HTTPSBroker(tmp_path)
    yield b
    b.broker.close()


def test_api_and_metrics_over_https_and_no_plain_http(https_broker: HTTPSBroker) -> None:
    status, body = https_broker.get(https_broker.https_port, "/api/overview")
    assert status == 200 and "node" in json.loads(body)
    status, body = https_broker.get(https_broker.https_port, "/api/whoami")
    assert status == 200 and json.loads(body)["name"] == "guest"
    status, body = https_broker.get(https_broker.metrics_tls_port, "/metrics")
    assert status == 200 and b"rabbitmq_" in body
    # The plain metrics port still answers; plain HTTP for the API is off.
    with urllib.request.urlopen(f"{https_broker.broker.metrics_url}/metrics", timeout=10) as response:
        assert response.status == 200
    assert not port_open("127.0.0.1", https_broker.plain_http_port)
    log = https_broker.broker.log
    assert "listening for HTTPS on" in log and "listening for HTTP on" not in log


def test_https_refuses_a_client_that_does_not_trust_the_certificate(https_broker: HTTPSBroker) -> None:
    with pytest.raises(urllib.error.URLError) as failure:
        urllib.request.urlopen(f"https://localhost:{https_broker.https_port}/api/overview",
                               context=ssl.create_default_context(), timeout=10)
    assert isinstance(failure.value.reason, ssl.SSLCertVerificationError)
    # Plain HTTP to the TLS port gets no HTTP answer.
    connection = http.client.HTTPConnection("127.0.0.1", https_broker.https_port, timeout=10)
    with pytest.raises((http.client.HTTPException, ConnectionError, OSError)):
        connection.request("GET", "/api/overview")
        connection.getresponse()


@pytest.mark.skipif(shutil.which("rabbitmqadmin") is None, reason="Debian's rabbitmqadmin is not installed")
def test_rabbitmqadmin_over_ssl(https_broker: HTTPSBroker) -> None:
    base = ["rabbitmqadmin", "-H", "localhost", "-P", str(https_broker.https_port), "-u", "guest", "-p", "guest",
            "--ssl", "--ssl-ca-cert-file", str(https_broker.ca.cert_path)]
    out = subprocess.run([*base, "declare", "queue", "name=over-https", "durable=true"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    out = subprocess.run([*base, "-f", "tsv", "-q", "list", "queues", "name"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0 and "over-https" in out.stdout.split(), out.stderr


def test_sighup_serves_a_new_certificate_to_new_connections(https_broker: HTTPSBroker) -> None:
    b = https_broker
    assert b.served_serial(b.https_port) == b.serial
    kept = http.client.HTTPSConnection("localhost", b.https_port, context=b.context(), timeout=10)
    kept.request("GET", "/api/whoami", headers={"Authorization": AUTH})
    assert kept.getresponse().read()
    old_serial = int(kept.sock.getpeercert()["serialNumber"], 16)

    new_cert, new_key, new_serial = b.ca.issue("renewed", server=True)
    shutil.copy(new_cert, b.cert)
    shutil.copy(new_key, b.key)
    os.kill(b.broker.pid, signal.SIGHUP)
    deadline = time.monotonic() + 10
    while "TLS certificates reloaded" not in b.broker.log:
        assert time.monotonic() < deadline, b.broker.log[-2000:]
        time.sleep(0.05)
    assert b.served_serial(b.https_port) == new_serial
    assert b.served_serial(b.metrics_tls_port) == new_serial
    # The connection opened before keeps its certificate and keeps working.
    kept.request("GET", "/api/whoami", headers={"Authorization": AUTH})
    response = kept.getresponse()
    assert response.status == 200 and json.loads(response.read())["name"] == "guest"
    assert int(kept.sock.getpeercert()["serialNumber"], 16) == old_serial == b.serial
    kept.close()


def test_lavinpyctl_over_https(https_broker: HTTPSBroker) -> None:
    # urllib's default context honours SSL_CERT_FILE: the test CA stands in for the system's.
    env = {**os.environ, "SSL_CERT_FILE": str(https_broker.ca.cert_path)}
    env.pop("LAVINPYCTL_URI", None)
    out = subprocess.run([sys.executable, "-m", "lavinpy.cli.ctl", "--uri",
                          f"https://guest:guest@localhost:{https_broker.https_port}", "list_vhosts"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "/" in out.stdout.split(), out.stderr


def test_a_proxy_header_on_the_https_port_is_refused_and_logged(https_broker: HTTPSBroker) -> None:
    # No trusted source is configured here: nobody may send one.
    with socket.create_connection(("127.0.0.1", https_broker.https_port), timeout=10) as sock:
        sock.sendall(b"PROXY TCP4 203.0.113.9 127.0.0.1 40000 15671\r\n")
        try:  # closed with the header unread: a reset, or an end of stream when it came first
            assert sock.recv(100) == b""
        except ConnectionResetError:
            pass
    deadline = time.monotonic() + 5
    while "HTTPS connection from 127.0.0.1" not in https_broker.broker.log:
        assert time.monotonic() < deadline, https_broker.broker.log[-2000:]
        time.sleep(0.05)
    assert https_broker.get(https_broker.https_port, "/api/whoami")[0] == 200
