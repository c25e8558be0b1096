"""AMQPS: TLS 1.2+ on amqps_port, client certificates, certificate reload on SIGHUP."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pika
import pika.exceptions
import pytest

from tests.helpers import free_port

from .conftest import REPO_ROOT, LocalBroker, lavinpy_only, port_open
from .rawamqp import commands
from .tls_certs import CA, encrypted

pytestmark = lavinpy_only("starts lavinpy with its own TLS settings")


class TLSBroker:
    def __init__(self, tmp_path: Path, *, client_certs: bool = False, key_password: str = "") -> None:
        self.ca = CA(tmp_path / "pki")
        self.cert, self.key, self.serial = self.ca.issue("server", server=True)
        if key_password:  # the server's key stored encrypted, its passphrase in the settings
            self.key = encrypted(self.key, key_password)
        self.amqps_port = free_port()
        # The HTTPS API and Prometheus over TLS off: their default ports are shared by every broker of the run.
        lines = [f"tls_cert: {self.cert}", f"tls_key: {self.key}", f"amqps_port: {self.amqps_port}",
                 "https_port: 0", "prometheus_tls_port: 0"]
        if key_password:
            lines.append(f"tls_key_password: '{key_password}'")
        if client_certs:
            lines += [f"tls_ca_cert: {self.ca.cert_path}", "tls_verify_peer: true", "tls_fail_if_no_peer_cert: true"]
        conf = tmp_path / "tls.yaml"
        conf.write_text("\n".join(lines) + "\n")
        self.broker = LocalBroker(tmp_path / "broker")
        self.broker.extra_args = ["--config", str(conf)]
        self.broker.start()
        deadline = time.monotonic() + 10
        while not port_open("127.0.0.1", self.amqps_port):
            assert time.monotonic() < deadline, f"no AMQPS listener:\n{self.broker.log[-3000:]}"
            time.sleep(0.05)

    def client_context(self, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca.cert_path))
        if cert is not None:
            ctx.load_cert_chain(str(cert), str(key))
        return ctx

    def pika_params(self, ctx: ssl.SSLContext) -> pika.ConnectionParameters:
        return pika.ConnectionParameters(host="127.0.0.1", port=self.amqps_port,
                                         ssl_options=pika.SSLOptions(ctx, "localhost"),
                                         credentials=pika.PlainCredentials("guest", "guest"),
                                         connection_attempts=1, socket_timeout=10)

    def peer_serial(self) -> tuple[int, str]:
        """The serial of the certificate a new TLS connection gets, and the TLS version."""
        with socket.create_connection(("127.0.0.1", self.amqps_port), timeout=10) as raw, \
                self.client_context().wrap_socket(raw, server_hostname="localhost") as tls:
            return int(tls.getpeercert()["serialNumber"], 16), str(tls.version())


@pytest.fixture
def tls_broker(tmp_path: Path) -> Iterator[TLSBroker]:
    b = TLSBroker(tmp_path)
    yield b
    b.broker.close()


@pytest.fixture
def mtls_broker(tmp_path: Path) -> Iterator[TLSBroker]:
    b = TLSBroker(tmp_path, client_certs=True)
    yield b
    b.broker.close()


def _roundtrip_pika(params: pika.ConnectionParameters) -> None:
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.confirm_delivery()
        ch.basic_publish("", q, b"over tls" * 1000)
        _, _, body = ch.basic_get(q, auto_ack=True)
        assert body == b"over tls" * 1000
    finally:
        conn.close()


def test_pika_over_tls_with_tls_1_2_or_later(tls_broker):
    _roundtrip_pika(tls_broker.pika_params(tls_broker.client_context()))
    serial, version = tls_broker.peer_serial()
    assert serial == tls_broker.serial and version in ("TLSv1.2", "TLSv1.3")
    # The plain listener is still there.
    _roundtrip_pika(pika.ConnectionParameters(host="127.0.0.1", port=tls_broker.broker.port,
                                              connection_attempts=1))


def test_aio_pika_over_tls(tls_broker):
    async def main() -> bytes:
        conn = await aio_pika.connect(host="localhost", port=tls_broker.amqps_port, ssl=True,
                                      ssl_context=tls_broker.client_context(), login="guest", password="guest")
        async with conn:
            ch = await conn.channel()
            q = await ch.declare_queue("", exclusive=True)
            await ch.default_exchange.publish(aio_pika.Message(b"aio over tls"), routing_key=q.name)
            msg = await q.get(timeout=5)
            await msg.ack()
            return msg.body
    assert asyncio.run(main()) == b"aio over tls"


def test_client_certificate_required(mtls_broker):
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(mtls_broker.pika_params(mtls_broker.client_context()))
    cert, key, _ = mtls_broker.ca.issue("client", server=False)
    _roundtrip_pika(mtls_broker.pika_params(mtls_broker.client_context(cert, key)))
    stranger = CA(mtls_broker.ca.dir / "other", "another CA")
    bad_cert, bad_key, _ = stranger.issue("stranger", server=False)
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(mtls_broker.pika_params(mtls_broker.client_context(bad_cert, bad_key)))


def test_sighup_reloads_the_certificate(tls_broker):
    old = pika.BlockingConnection(tls_broker.pika_params(tls_broker.client_context()))
    try:
        assert tls_broker.peer_serial()[0] == tls_broker.serial
        staged = tls_broker.ca.dir / "next"
        staged.mkdir()
        next_ca = CA.__new__(CA)
        next_ca.__dict__.update(tls_broker.ca.__dict__, dir=staged)
        cert, key, serial = next_ca.issue("server", server=True)
        assert serial != tls_broker.serial
        cert.replace(tls_broker.cert)
        key.replace(tls_broker.key)
        tls_broker.broker.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while tls_broker.peer_serial()[0] != serial:
            assert time.monotonic() < deadline, f"still the old certificate:\n{tls_broker.broker.log[-3000:]}"
            time.sleep(0.1)
        assert "TLS certificates reloaded" in tls_broker.broker.log
        ch = old.channel()  # connections made before the reload go on
        ch.queue_declare("", exclusive=True)
        _roundtrip_pika(tls_broker.pika_params(tls_broker.client_context()))
        # A broken file on SIGHUP: logged, the running certificate stays.
        tls_broker.key.write_text("not a key\n")
        tls_broker.broker.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "not reloaded" not in tls_broker.broker.log:
            assert time.monotonic() < deadline, tls_broker.broker.log[-3000:]
            time.sleep(0.1)
        assert tls_broker.peer_serial()[0] == serial
    finally:
        old.close()


def test_spark_client_over_amqps(tls_broker):
    from lavinpy.spark.client import AMQPParams, Connection
    from lavinpy.spark.publisher import ConfirmPublisher

    q = f"spark-tls-{tls_broker.serial}"
    url = f"amqps://guest:guest@localhost:{tls_broker.amqps_port}/?cacertfile={tls_broker.ca.cert_path}"
    with Connection(AMQPParams.from_url(url)).open() as conn:
        ch = conn.open_channel()
        conn.call(ch, commands.Queue.Declare(queue=q, durable=True), commands.Queue.DeclareOk)
        pub = ConfirmPublisher(conn, max_in_flight=500)
        for i in range(3000):
            pub.publish("", q, b"%06d" % i + b"x" * 20000)  # ~60 MB: many TLS records each way
        pub.wait_for_confirms()
        assert pub.unconfirmed == 0 and pub.nacked == 0
    conn = pika.BlockingConnection(tls_broker.pika_params(tls_broker.client_context()))
    try:
        assert conn.channel().queue_declare(q, passive=True).method.message_count == 3000
    finally:
        conn.close()
    with pytest.raises(Exception, match="TLS to amqps://guest@localhost"):  # not our CA: refused
        Connection(AMQPParams.from_url(f"amqps://guest:guest@localhost:{tls_broker.amqps_port}/")).open()


def test_encrypted_keys_at_both_ends(tmp_path: Path) -> None:
    """A broker whose key is encrypted (tls_key_password) requires client certificates; the Spark client's
    key is encrypted too, its passphrase in the URL's password key (RabbitMQ's URI spec)."""
    from lavinpy.spark.client import AMQPParams, Connection

    b = TLSBroker(tmp_path, client_certs=True, key_password="server pass")
    try:
        cert, key, _ = b.ca.issue("client", server=False)
        key = encrypted(key, "client pass")
        base = (f"amqps://guest:guest@localhost:{b.amqps_port}/?cacertfile={b.ca.cert_path}"
                f"&certfile={cert}&keyfile={key}")
        with Connection(AMQPParams.from_url(base + "&password=client%20pass")).open() as conn:
            ch = conn.open_channel()
            conn.call(ch, commands.Queue.Declare(queue="", exclusive=True), commands.Queue.DeclareOk)
        with pytest.raises(Exception, match="is encrypted: give its passphrase \\(the URI's password key\\)"):
            Connection(AMQPParams.from_url(base)).open()
    finally:
        b.broker.close()


def test_perf_tool_over_amqps(tls_broker):
    uri = f"amqps://guest:guest@localhost:{tls_broker.amqps_port}/?cacertfile={tls_broker.ca.cert_path}"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    res = subprocess.run([sys.executable, "-m", "lavinpy.cli.perf", "--json-only", "--uri", uri, "-z", "1",
                          "-c", "32", "-s", "64", "--drain", "--drain-timeout", "20"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["published"] > 0 and summary["drained"] and summary["nacked"] == 0
    assert summary["params"]["uri"].startswith("amqps://localhost:")  # no password echoed
