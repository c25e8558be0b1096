"""The HTTPS / Prometheus TLS ports and proxy_protocol_trusted_sources from the file, the environment
and the command line, as the other settings."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from lavinpy import config
from lavinpy.config import ConfigError


def _flags(*argv: str) -> config.Config:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return config.from_args(parser.parse_args(["--config", "/dev/null", *argv]))


def test_defaults_are_rabbitmqs_ports_and_no_trusted_source() -> None:
    cfg = config.load(env={})
    assert (cfg.https_port, cfg.prometheus_tls_port) == (15671, 15691)
    assert cfg.proxy_protocol_trusted_sources == []
    assert not cfg.https_enabled and not cfg.tls_enabled  # no certificate: no TLS port
    cfg = config.load(env={"LAVINPY_TLS_CERT": "c.pem", "LAVINPY_TLS_KEY": "k.pem", "LAVINPY_AMQPS_PORT": "0"})
    assert cfg.https_enabled and cfg.prometheus_tls_enabled and cfg.tls_enabled and not cfg.amqps_enabled


def test_trusted_sources_from_file_environment_and_flag(tmp_path: Path) -> None:
    conf = tmp_path / "c.yaml"
    conf.write_text("proxy_protocol_trusted_sources: [10.0.0.5, 10.1.0.0/16]\n")
    assert config.load(conf, env={}).proxy_protocol_trusted_sources == ["10.0.0.5", "10.1.0.0/16"]
    env = {"LAVINPY_PROXY_PROTOCOL_TRUSTED_SOURCES": "192.0.2.1, 2001:db8::/32"}
    assert config.load(conf, env=env).proxy_protocol_trusted_sources == ["192.0.2.1", "2001:db8::/32"]
    cfg = _flags("--proxy-protocol-trusted-sources", "127.0.0.1,::1", "--https-port", "8443",
                 "--prometheus-tls-port", "9443", "--http-port", "0")
    assert cfg.proxy_protocol_trusted_sources == ["127.0.0.1", "::1"]
    assert (cfg.https_port, cfg.prometheus_tls_port, cfg.http_port) == (8443, 9443, 0)


@pytest.mark.parametrize("entry", ["10.0.0.0/33", "load-balancer.example", "10.0.0.1/8/8"])
def test_a_bad_trusted_source_stops_the_start(entry: str) -> None:
    with pytest.raises(ConfigError, match="proxy_protocol_trusted_sources"):
        config.load(env={"LAVINPY_PROXY_PROTOCOL_TRUSTED_SOURCES": entry})


def test_tls_ports_are_checked() -> None:
    with pytest.raises(ConfigError, match="https_port"):
        config.load(env={"LAVINPY_HTTPS_PORT": "70000"})
    with pytest.raises(ConfigError, match="prometheus_tls_port"):
        config.load(env={"LAVINPY_PROMETHEUS_TLS_PORT": "-1"})
