"""Settings: defaults < YAML file < LAVINPY_* environment < command-line flags; bad values are refused."""

from __future__ import annotations

import argparse
import importlib.resources
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lavinpy import config

REPO = Path(__file__).resolve().parents[1]


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return parser.parse_args(argv)


def test_defaults_match_the_shipped_config_file():
    # The file installed with the package, which conf/lavinpy.yaml links to.
    packaged = importlib.resources.files("lavinpy").joinpath("lavinpy.yaml").read_text()
    assert (REPO / "conf" / "lavinpy.yaml").read_text() == packaged
    shipped = yaml.safe_load(packaged)
    defaults = config.Config()
    assert set(shipped) == {f for f in vars(defaults)}, "conf/lavinpy.yaml must list every setting"
    listed = re.findall(r"^(\w+):", packaged, flags=re.MULTILINE)  # YAML keeps the last of a repeated key
    assert len(listed) == len(shipped), f"listed twice: {sorted({k for k in listed if listed.count(k) > 1})}"
    for name, value in shipped.items():
        assert getattr(defaults, name) == value, name


def test_flag_beats_environment_beats_file(tmp_path: Path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("amqp_port: 1111\nhttp_port: 2222\nlog_level: debug\nsegment_size: 65536\n")
    env = {"LAVINPY_AMQP_PORT": "3333", "LAVINPY_HTTP_PORT": "4444", "LAVINPY_LOOPBACK_USERS": "a, b"}
    cfg = config.load(cfg_file, env=env, overrides={"amqp_port": 5555})
    assert cfg.amqp_port == 5555  # flag
    assert cfg.http_port == 4444  # environment over file
    assert cfg.log_level == "debug"  # file over default
    assert cfg.segment_size == 65536
    assert cfg.loopback_users == ["a", "b"]
    assert cfg.data_dir == "data"  # default


def test_command_line_flags_map_to_settings(tmp_path: Path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("fsync: batch\n")
    args = parse(["--config", str(cfg_file), "--data-dir", "/x", "--bind", "0.0.0.0", "--amqp-port", "5673",
                  "--http-port", "0", "--log-level", "warning"])
    cfg = config.from_args(args)
    assert (cfg.data_dir, cfg.bind, cfg.amqp_port, cfg.http_port, cfg.log_level, cfg.fsync) == \
        ("/x", ["0.0.0.0"], 5673, 0, "warning", "batch")


@pytest.mark.parametrize("text, message", [
    ("fsync: sometimes\n", "fsync must be one of"),
    ("amqp_port: 70000\n", "amqp_port must be between"),
    ("segment_size: 10\n", "segment_size must be at least"),
    ("no_such_setting: 1\n", "unknown setting 'no_such_setting'"),
    ("amqp_port: abc\n", "setting amqp_port: cannot use 'abc'"),
    ("- a list\n", "must hold a mapping"),
    ("mqtt_max_subscribe_filters: 0\n", "mqtt_max_subscribe_filters must be positive"),
    ("mqtt_retained_max_bytes: 0\n", "mqtt_retained_max_bytes must be positive"),
])
def test_bad_settings_are_refused_with_a_clear_message(tmp_path: Path, text: str, message: str):
    cfg_file = tmp_path / "bad.yaml"
    cfg_file.write_text(text)
    with pytest.raises(config.ConfigError, match=message):
        config.load(cfg_file, env={})


def test_broker_exits_2_on_a_bad_setting(tmp_path: Path):
    env = {"LAVINPY_FSYNC": "sometimes", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "lavinpy", "--data-dir", str(tmp_path / "d")],
                          cwd=tmp_path, env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 2
    assert "fsync must be one of" in proc.stderr
    assert not (tmp_path / "d").exists()  # nothing was created


def test_bind_is_a_list_and_tls_settings_are_typed(tmp_path: Path):
    cfg = config.load(None, env={"LAVINPY_BIND": "127.0.0.1, ::1", "LAVINPY_TLS_VERIFY_PEER": "true",
                                 "LAVINPY_TLS_CERT": "c.pem", "LAVINPY_TLS_KEY": "k.pem",
                                 "LAVINPY_TLS_CA_CERT": "ca.pem"})
    assert cfg.bind == ["127.0.0.1", "::1"]
    assert cfg.tls_verify_peer is True and cfg.tls_fail_if_no_peer_cert is False
    assert cfg.amqps_port == 5671 and cfg.amqps_enabled
    assert config.Config().bind == ["127.0.0.1", "::1"] and config.Config().channel_max == 2047
    assert not config.Config().amqps_enabled  # no certificate, no AMQPS listener
    args = parse(["--bind", "0.0.0.0,::", "--amqps-port", "0"])
    cfg = config.from_args(args)
    assert (cfg.bind, cfg.amqps_port) == (["0.0.0.0", "::"], 0)


@pytest.mark.parametrize("text, message", [
    ("tls_cert: c.pem\n", "tls_cert and tls_key must be set together"),
    ("tls_cert: c.pem\ntls_key: k.pem\ntls_verify_peer: true\n", "tls_verify_peer needs tls_ca_cert"),
    ("tls_fail_if_no_peer_cert: true\n", "tls_fail_if_no_peer_cert needs tls_verify_peer"),
    ("tls_verify_peer: maybe\n", "setting tls_verify_peer: cannot use 'maybe'"),
    ("amqps_port: 70000\n", "amqps_port must be between"),
    ("bind: []\n", "bind must name at least one address"),
])
def test_bad_listener_settings_are_refused(tmp_path: Path, text: str, message: str):
    cfg_file = tmp_path / "bad.yaml"
    cfg_file.write_text(text)
    with pytest.raises(config.ConfigError, match=message):
        config.load(cfg_file, env={})


def test_port_offset_moves_every_listener_that_is_on(tmp_path: Path):
    cfg = config.from_args(parse(["--port-offset", "200", "--mqtt-port", "0", "--amqp-port", "6000"]))
    assert (cfg.amqp_port, cfg.amqps_port, cfg.http_port, cfg.https_port, cfg.prometheus_port,
            cfg.prometheus_tls_port, cfg.mqtts_port, cfg.clustering_port) == (6200, 5871, 15872, 15871, 15892,
                                                                              15891, 9083, 5879)
    assert cfg.mqtt_port == 0, "a listener that is off stays off"
    # one node's ports, shifted by multiples of 100, never meet another node's
    nodes = [config.load(None, env={}, overrides={"port_offset": i * 100}) for i in range(1, 4)]
    ports = [getattr(node, name) for node in nodes for name in config.LISTENER_PORTS]
    assert len(ports) == len(set(ports))
    with pytest.raises(config.ConfigError, match="http_port must be .* not 65672 .port_offset 50000 included"):
        config.load(None, env={}, overrides={"port_offset": 50000})
    assert config.load(None, env={"LAVINPY_PORT_OFFSET": "100"}).amqp_port == 5772
