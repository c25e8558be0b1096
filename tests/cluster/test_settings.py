"""The clustering settings from the YAML file, LAVINPY_CLUSTERING_* variables and --clustering-* flags."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from lavinpy import config


def parse(argv: list[str]) -> config.Config:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return config.from_args(parser.parse_args(argv))


def test_defaults_are_lavinmqs() -> None:
    cfg = config.load(env={})
    assert cfg.clustering is False
    assert cfg.clustering_etcd_endpoints == "127.0.0.1:2379"
    assert cfg.clustering_etcd_prefix == "lavinpy"
    assert (cfg.clustering_bind, cfg.clustering_port) == ("127.0.0.1", 5679)
    assert cfg.clustering_uri == "tcp://127.0.0.1:5679"


def test_yaml_then_environment_then_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("clustering: true\nclustering_etcd_endpoints: a:1,b:2\nclustering_port: 6000\n"
                         "clustering_on_leader_elected: echo up\nclustering_etcd_prefix: from-yaml\n")
    monkeypatch.setenv("LAVINPY_CLUSTERING_ETCD_PREFIX", "from-env")
    monkeypatch.setenv("LAVINPY_CLUSTERING_ON_LEADER_LOST", "echo down")
    cfg = parse(["--config", str(yaml_file), "--clustering-port", "7000",
                 "--clustering-advertised-uri", "tcp://node1.example:7000"])
    assert cfg.clustering is True
    assert cfg.clustering_etcd_endpoints == "a:1,b:2"
    assert cfg.clustering_etcd_prefix == "from-env"
    assert cfg.clustering_port == 7000
    assert cfg.clustering_uri == "tcp://node1.example:7000"
    assert (cfg.clustering_on_leader_elected, cfg.clustering_on_leader_lost) == ("echo up", "echo down")


def test_flags_turn_clustering_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(Path(__file__).parent)  # no conf/lavinpy.yaml here
    cfg = parse(["--clustering", "--clustering-bind", "::1", "--clustering-etcd-endpoints", "e1:2379,e2:2379"])
    assert cfg.clustering and cfg.clustering_bind == "::1"
    assert cfg.clustering_uri == "tcp://[::1]:5679"
    assert cfg.clustering_etcd_endpoints == "e1:2379,e2:2379"
    assert parse([]).clustering is False


@pytest.mark.parametrize("overrides, message", [
    ({"clustering_port": 70000}, "clustering_port"),
    ({"clustering_advertised_uri": "http://x:1"}, "tcp://host:port"),
    ({"clustering_etcd_endpoints": " , "}, "at least one etcd endpoint"),
    ({"clustering_etcd_prefix": ""}, "prefix"),
])
def test_bad_values_are_refused(overrides: dict, message: str) -> None:
    with pytest.raises(config.ConfigError, match=message):
        config.load(env={}, overrides={"clustering": True, **overrides})
