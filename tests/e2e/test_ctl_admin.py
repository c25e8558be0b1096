"""lavinpyctl's user, vhost, permission, policy and definitions commands (RabbitMQ's admin API paths)."""

from __future__ import annotations

import json
import uuid

import pika
import pytest

from .conftest import http_call
from .test_ctl import ctl


@pytest.fixture
def admin_api(fresh_broker):
    return fresh_broker


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _can_connect(broker, user: str, password: str, vhost: str = "/") -> bool:
    try:
        pika.BlockingConnection(pika.URLParameters(broker.url_for(user, password, vhost))).close()
        return True
    except pika.exceptions.AMQPError:
        return False


def test_users_and_passwords(admin_api):
    b = admin_api
    assert ctl(b, "add_user", "carol", "pw1").returncode == 0
    assert ctl(b, "set_permissions", "carol", ".*", ".*", ".*").returncode == 0
    assert _can_connect(b, "carol", "pw1")
    assert ctl(b, "change_password", "carol", "pw2").returncode == 0
    assert not _can_connect(b, "carol", "pw1") and _can_connect(b, "carol", "pw2")
    assert ctl(b, "set_user_tags", "carol", "monitoring", "policymaker").returncode == 0
    assert _can_connect(b, "carol", "pw2")  # tags changed, password kept
    users = json.loads(ctl(b, "-f", "json", "list_users").stdout)
    carol = next(u for u in users if u["user"] == "carol")
    assert carol["tags"] == "[monitoring, policymaker]"
    assert ctl(b, "delete_user", "carol").returncode == 0
    assert "carol" not in ctl(b, "list_users").stdout
    missing = ctl(b, "change_password", "nobody", "x")
    assert missing.returncode == 1 and "404" in missing.stderr


def test_vhosts_and_permissions(admin_api):
    b = admin_api
    vhost = _name("vh")
    assert ctl(b, "add_vhost", vhost).returncode == 0
    assert vhost in ctl(b, "list_vhosts").stdout.split()
    assert ctl(b, "add_user", "dave", "pw").returncode == 0
    assert ctl(b, "-p", vhost, "set_permissions", "dave", "^dave-.*", ".*", ".*").returncode == 0
    perms = json.loads(ctl(b, "-f", "json", "-p", vhost, "list_permissions").stdout)
    assert {"user": "dave", "configure": "^dave-.*", "write": ".*", "read": ".*"} in perms
    assert _can_connect(b, "dave", "pw", vhost)
    assert ctl(b, "clear_permissions", "-p", vhost, "dave").returncode == 0
    assert not _can_connect(b, "dave", "pw", vhost)
    assert ctl(b, "delete_vhost", vhost).returncode == 0
    assert vhost not in ctl(b, "list_vhosts").stdout.split()


def test_policies(admin_api):
    b = admin_api
    done = ctl(b, "set_policy", "--apply-to", "queues", "--priority", "3", "limits", "^lim\\.", '{"max-length": 2}')
    assert done.returncode == 0, done.stderr
    policies = json.loads(ctl(b, "-f", "json", "list_policies").stdout)
    policy = next(p for p in policies if p["name"] == "limits")
    assert policy["pattern"] == "^lim\\." and policy["apply-to"] == "queues" and policy["priority"] == 3
    assert policy["definition"] == {"max-length": 2}
    bad = ctl(b, "set_policy", "broken", ".*", "{not json")
    assert bad.returncode == 64
    assert ctl(b, "clear_policy", "limits").returncode == 0
    assert "limits" not in ctl(b, "list_policies").stdout


def test_export_and_import_definitions(admin_api, tmp_path):
    b = admin_api
    assert ctl(b, "add_user", "erin", "pw").returncode == 0
    exported = tmp_path / "defs.json"
    assert ctl(b, "export_definitions", str(exported)).returncode == 0
    definitions = json.loads(exported.read_text())
    assert any(u["name"] == "erin" for u in definitions["users"])
    definitions["queues"].append({"name": "from-file", "vhost": "/", "durable": True, "auto_delete": False,
                                  "arguments": {}})
    assert ctl(b, "delete_user", "erin").returncode == 0
    exported.write_text(json.dumps(definitions))
    done = ctl(b, "import_definitions", str(exported))
    assert done.returncode == 0, done.stderr
    status, user, _ = http_call(b, "GET", "/api/users/erin")
    assert status == 200 and user["name"] == "erin"
    assert ctl(b, "set_permissions", "erin", ".*", ".*", ".*").returncode == 0
    assert _can_connect(b, "erin", "pw")  # the exported password hash still works
    status, _, _ = http_call(b, "GET", "/api/queues/%2F/from-file")
    assert status == 200
    from_stdin = ctl(b, "import_definitions", "-", stdin="{broken")
    assert from_stdin.returncode == 64


def test_large_definitions_transfer_with_progress(admin_api, tmp_path):
    """Over 1 MiB, import and export say how far they got on stderr (a line per 10 % off a terminal)."""
    b = admin_api
    queue = f"big-{uuid.uuid4().hex[:8]}"
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"queues": [{"name": queue, "vhost": "/", "durable": True, "auto_delete": False,
                                           "arguments": {"x-note": "n" * (3 << 19)}}]}))
    done = ctl(b, "import_definitions", str(big))
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("import_definitions: sending: ")]
    assert len(lines) >= 5 and lines[-1].startswith("import_definitions: sending: 100% ("), done.stderr
    exported = ctl(b, "export_definitions", str(tmp_path / "out.json"))
    assert exported.returncode == 0, exported.stderr
    assert "export_definitions: receiving: 100% (" in exported.stderr, exported.stderr
    assert queue in (tmp_path / "out.json").read_text()
    quiet = ctl(b, "-q", "export_definitions", str(tmp_path / "quiet.json"))
    assert quiet.returncode == 0 and "receiving" not in quiet.stderr
    assert http_call(b, "DELETE", f"/api/queues/%2F/{queue}")[0] in (200, 204)
