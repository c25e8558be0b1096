"""A shovel from an amqps:// source (the broker's certificate checked against the test CA)."""

from __future__ import annotations

import time
from pathlib import Path

from tests.e2e.conftest import LocalBroker, port_open
from tests.e2e.tls_certs import CA
from tests.helpers import free_ports

from .engine import EngineThread
from .test_shovel_engine import _count, _publish


def test_amqps_source(tmp_path: Path) -> None:
    ca = CA(tmp_path / "pki")
    cert, key, _serial = ca.issue("server", server=True)
    amqps_port, https_port = free_ports(2)
    conf = tmp_path / "tls.yaml"
    conf.write_text(f"tls_cert: {cert}\ntls_key: {key}\namqps_port: {amqps_port}\nhttps_port: {https_port}\n"
                    "prometheus_tls_port: 0\n")
    b = LocalBroker(tmp_path / "broker")
    b.extra_args = ["--config", str(conf)]
    b.start()
    try:
        assert port_open("127.0.0.1", amqps_port)
        engine = EngineThread()
        try:
            _publish(b.url, "tls-src", 50)
            src = f"amqps://guest:guest@localhost:{amqps_port}/?cacertfile={ca.cert_path}"
            engine.apply("tls", {"src-uri": src, "src-queue": "tls-src", "dest-uri": b.url, "dest-queue": "tls-dst"})
            engine.wait_state("tls", "running")
            deadline = time.monotonic() + 10
            while _count(b.url, "tls-dst") < 50 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _count(b.url, "tls-dst") == 50
            assert engine.status("tls")["src_uri"].startswith("amqps://guest:***@localhost:")
        finally:
            engine.close()
    finally:
        b.stop()
