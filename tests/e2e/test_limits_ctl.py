"""Limits, operator policies and parameters through lavinpyctl (rabbitmqctl's forms) and Debian's rabbitmqadmin."""

from __future__ import annotations

import json
import shutil
import uuid

import pika
import pytest

from .conftest import http_call, lavinpy_only
from .test_ctl import ctl

pytestmark = lavinpy_only("lavinpyctl and rabbitmqadmin against a lavinpy started by the tests")
RABBITMQADMIN = shutil.which("rabbitmqadmin")


def _ok(done) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _vhost(broker) -> str:
    name = f"cv-{uuid.uuid4().hex[:8]}"
    _ok(ctl(broker, "add_vhost", name))
    _ok(ctl(broker, "set_permissions", "-p", name, "guest", ".*", ".*", ".*"))
    return name


def test_ctl_vhost_and_user_limits(broker):
    vhost = _vhost(broker)
    _ok(ctl(broker, "set_vhost_limits", "-p", vhost, '{"max-connections": 4, "max-queues": 2}'))
    assert json.loads(_ok(ctl(broker, "-q", "list_vhost_limits", "-p", vhost))) == {
        "max-connections": 4, "max-queues": 2}
    assert vhost in _ok(ctl(broker, "list_vhost_limits", "--global"))
    bad = ctl(broker, "set_vhost_limits", "-p", vhost, '{"max-connexions": 4}')
    assert bad.returncode != 0 and "max-connexions" in bad.stderr
    _ok(ctl(broker, "clear_vhost_limits", "-p", vhost))
    assert _ok(ctl(broker, "-q", "list_vhost_limits", "-p", vhost)).strip() == ""
    user = f"cu-{uuid.uuid4().hex[:8]}"
    _ok(ctl(broker, "add_user", user, "pw"))
    _ok(ctl(broker, "set_user_limits", user, '{"max-connections": 3, "max-channels": 9}'))
    assert json.loads(_ok(ctl(broker, "-q", "list_user_limits", "--user", user))) == {
        "max-connections": 3, "max-channels": 9}
    _ok(ctl(broker, "clear_user_limits", user, "max-channels"))
    assert json.loads(_ok(ctl(broker, "-q", "list_user_limits", "--user", user))) == {"max-connections": 3}
    _ok(ctl(broker, "clear_user_limits", user, "all"))
    _ok(ctl(broker, "delete_user", user))


def test_ctl_operator_policies_and_parameters(broker):
    vhost = _vhost(broker)
    _ok(ctl(broker, "set_operator_policy", "-p", vhost, "--priority", "1", "cap", "^c", '{"max-length": 1}'))
    rows = _ok(ctl(broker, "-s", "list_operator_policies", "-p", vhost)).splitlines()
    assert rows == [f'{vhost}\tcap\t^c\tqueues\t{{"max-length":1}}\t1']
    conn = pika.BlockingConnection(pika.URLParameters(broker.url_for("guest", "guest", vhost)))
    ch = conn.channel()
    ch.queue_declare("cq")
    ch.basic_publish("", "cq", b"1")
    ch.basic_publish("", "cq", b"2")
    conn.close()
    assert http_call(broker, "GET", f"/api/queues/{vhost}/cq")[1]["messages"] == 1
    _ok(ctl(broker, "clear_operator_policy", "-p", vhost, "cap"))
    _ok(ctl(broker, "set_parameter", "-p", vhost, "vhost-limits", "limits", '{"max-queues": 7}'))
    assert _ok(ctl(broker, "-s", "list_parameters", "-p", vhost)).splitlines() == [
        'vhost-limits\tlimits\t{"max-queues":7}']
    refused = ctl(broker, "set_parameter", "-p", vhost, "mqtt-port-to-vhost-mapping", "m", '{"1883": "/"}')
    assert refused.returncode != 0 and "mqtt-port-to-vhost-mapping" in refused.stderr
    _ok(ctl(broker, "clear_parameter", "-p", vhost, "vhost-limits", "limits"))
    assert _ok(ctl(broker, "-s", "list_parameters", "-p", vhost)).strip() == ""


def test_ctl_global_parameters(fresh_broker):
    _ok(ctl(fresh_broker, "set_global_parameter", "cluster_name", '"east"'))
    assert _ok(ctl(fresh_broker, "-s", "list_global_parameters")).splitlines() == ["cluster_name\teast"]
    assert http_call(fresh_broker, "GET", "/api/overview")[1]["cluster_name"] == "east"
    _ok(ctl(fresh_broker, "clear_global_parameter", "cluster_name"))
    assert _ok(ctl(fresh_broker, "-s", "list_global_parameters")).strip() == ""


@pytest.mark.skipif(RABBITMQADMIN is None, reason="rabbitmqadmin is not installed")
def test_rabbitmqadmin_lists_and_declares(broker):
    import subprocess

    def admin(*args: str) -> str:
        cmd = [RABBITMQADMIN, "-H", broker.host, "-P", str(broker.http_port), "-u", "guest", "-p", "guest", *args]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"{' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout

    vhost = _vhost(broker)
    admin("declare", "vhost_limit", f"vhost={vhost}", "name=max-queues", "value=3")
    admin("-V", vhost, "declare", "operator_policy", "name=op", "pattern=.*", 'definition={"expires": 60000}')
    limits = json.loads(admin("-f", "raw_json", "list", "vhost_limits"))
    assert {"vhost": vhost, "value": {"max-queues": 3}} in limits
    parameters = json.loads(admin("-f", "raw_json", "list", "parameters"))
    assert {"name": "limits", "vhost": vhost, "component": "vhost-limits", "value": {"max-queues": 3}} in parameters
    policies = json.loads(admin("-f", "raw_json", "list", "operator_policies"))
    assert [(p["vhost"], p["name"]) for p in policies if p["vhost"] == vhost] == [(vhost, "op")]
    admin("-V", vhost, "delete", "operator_policy", "name=op")
    admin("delete", "vhost_limit", f"vhost={vhost}", "name=max-queues")
    assert all(item["vhost"] != vhost for item in json.loads(admin("-f", "raw_json", "list", "vhost_limits")))
