"""lavinpyctl as scripts written for rabbitmqctl call it: -q / -s / --no-table-headers, --version, ping,
await_startup, list_user_permissions, close_all_connections, every list_queues column on every queue
kind, unknown columns as usage errors (64), cluster_status on one node, status's node figures."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import pika
import pytest

from lavinpy import __version__
from lavinpy.cli.ctl_columns import COMMANDS, QUEUE_COLUMNS
from tests.helpers import free_port, wait_until

from .conftest import REPO_ROOT, http_call, lavinpy_only
from .test_ctl import ctl


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_quiet_silent_and_no_headers(broker, clients):
    _, ch = clients.channel()
    queue = clients.track_queue(_name("quiet"))
    ch.queue_declare(queue)
    ch.basic_publish("", queue, b"a")
    ch.basic_publish("", queue, b"b")
    plain = ctl(broker, "list_queues", "name", "messages").stdout.splitlines()
    assert plain[:2] == ["Listing queues for vhost / ...", "name\tmessages"]
    for quiet in (["-q"], ["--quiet"]):
        lines = ctl(broker, *quiet, "list_queues", "name", "messages").stdout.splitlines()
        assert lines[0] == "name\tmessages" and f"{queue}\t2" in lines
        assert not any(line.startswith("Listing") for line in lines)
    after = ctl(broker, "list_queues", "-q", "name", "messages").stdout.splitlines()  # the option after the command
    assert after[0] == "name\tmessages"
    silent = ctl(broker, "-s", "list_queues", "name", "messages").stdout.splitlines()
    assert f"{queue}\t2" in silent and "name\tmessages" not in silent
    assert all(len(line.split("\t")) == 2 for line in silent)  # rows only
    no_headers = ctl(broker, "list_queues", "--no-table-headers", "name", "messages").stdout.splitlines()
    assert no_headers[0].startswith("Listing") and "name\tmessages" not in no_headers
    # rabbitmqctl's node options and list_queues's node filters: one node holds every queue
    assert f"{queue}\t2" in ctl(broker, "-n", "rabbit@elsewhere", "-s", "list_queues", "name", "messages",
                                 "--local", "--online").stdout.splitlines()
    assert ctl(broker, "-s", "list_queues", "--offline").stdout == ""
    assert "Status of node" in ctl(broker, "status").stdout
    assert "Status of node" not in ctl(broker, "-q", "status").stdout


# 22 lavinpyctl processes, each a fresh interpreter (0.5 s on an idle machine, 2.5 s and more at a load of
# 13 on 2 cores: the suite's 60 s default ran out). Each call has its own 60 s limit, which catches a hang.
@pytest.mark.timeout(300)
def test_unknown_column_is_a_usage_error_on_every_list(broker):
    for command in COMMANDS:
        done = ctl(broker, command, "name", "no_such_column")
        assert done.returncode == 64, (command, done.stdout, done.stderr)
        assert "no_such_column" in done.stderr and done.stdout == "", command
    # every column a list accepts is accepted
    for command, spec in COMMANDS.items():
        done = ctl(broker, "-s", command, *spec.columns)
        assert done.returncode == 0, (command, done.stderr)


def test_list_queues_every_column_on_every_kind(broker, clients):
    conn, ch = clients.channel()
    names = {kind: clients.track_queue(_name(kind)) for kind in ("classic", "priority", "stream", "excl")}
    ch.queue_declare(names["classic"], durable=True)
    ch.queue_declare(names["priority"], durable=True, arguments={"x-max-priority": 5})
    ch.queue_declare(names["stream"], durable=True, arguments={"x-queue-type": "stream"})
    ch.queue_declare(names["excl"], durable=True)
    delayed = clients.track_exchange(_name("delayed"))
    ch.exchange_declare(delayed, "x-delayed-message", arguments={"x-delayed-type": "direct"})
    for kind in ("classic", "priority", "stream"):
        for _ in range(3):
            ch.basic_publish("", names[kind], b"m")
    ch.basic_qos(prefetch_count=1)
    ch.basic_consume(names["classic"], lambda *a: None)  # one unacked delivery
    ch.basic_consume(names["excl"], lambda *a: None, exclusive=True, consumer_tag="the-only-one")
    reader = conn.channel()  # a stream consumer reading from the first offset
    reader.basic_qos(prefetch_count=10)
    reader.basic_consume(names["stream"], lambda *a: None, arguments={"x-stream-offset": "first"})
    owned = ch.queue_declare("", exclusive=True).method.queue  # owned by this connection
    conn.process_data_events(time_limit=0.5)
    port = conn._impl._transport._sock.getsockname()[1]
    conn_name = next(c["name"] for c in http_call(broker, "GET", "/api/connections")[1] if c["peer_port"] == port)
    _, owned_info, _ = http_call(broker, "GET", f"/api/queues/%2F/{owned}")
    assert owned_info["owner_pid_details"] == {"name": conn_name, "peer_host": "127.0.0.1", "peer_port": port}

    rows = {r["name"]: r for r in json.loads(ctl(broker, "-f", "json", "list_queues", *QUEUE_COLUMNS).stdout)}
    for kind, name in names.items():
        assert list(rows[name]) == QUEUE_COLUMNS, kind
        assert rows[name]["durable"] is True and rows[name]["state"] == "running"
        assert rows[name]["slave_pids"] == "" and rows[name]["pid"].startswith("<lavinpy@")
    classic, priority, stream = rows[names["classic"]], rows[names["priority"]], rows[names["stream"]]
    assert (classic["messages"], classic["messages_ready"], classic["messages_unacknowledged"]) == (3, 2, 1)
    assert (classic["messages_ram"], classic["messages_ready_ram"], classic["messages_unacknowledged_ram"]) == (3, 2, 1)
    assert classic["consumers"] == 1 and classic["type"] == "classic" and classic["leader"] == ""
    assert priority["arguments"] == {"x-max-priority": 5} and priority["messages"] == 3
    assert stream["type"] == "stream" and stream["messages"] == 3 and stream["consumers"] == 1
    assert stream["leader"] == classic["pid"][1:-1] and stream["members"] == [stream["leader"]]
    excl = rows[names["excl"]]
    assert excl["exclusive_consumer_tag"] == "the-only-one" and excl["exclusive_consumer_pid"] == excl["pid"]
    assert classic["exclusive_consumer_tag"] == "" and classic["owner_pid"] == ""
    assert rows[owned]["exclusive"] is True and rows[owned]["owner_pid"] == conn_name

    tsv = ctl(broker, "-s", "list_queues", *QUEUE_COLUMNS).stdout.splitlines()
    assert all(len(line.split("\t")) == len(QUEUE_COLUMNS) for line in tsv)
    exchanges = ctl(broker, "-s", "list_exchanges", "name", "type", "policy").stdout.splitlines()
    assert f"{delayed}\tx-delayed-message\t" in exchanges


def test_list_queues_every_column_value(broker, clients):
    """Each rabbitmqctl column of each queue kind, as a script reads it from ``lavinpyctl -s list_queues``."""
    conn, ch = clients.channel()
    classic, quorum, stream = (clients.track_queue(_name(f"values-{kind}")) for kind in ("classic", "quorum", "stream"))
    ch.queue_declare(classic, durable=True)
    ch.queue_declare(quorum, durable=True, arguments={"x-queue-type": "quorum"})
    ch.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
    persistent = pika.BasicProperties(delivery_mode=2, timestamp=1_700_000_000)
    ch.basic_publish("", classic, b"first", persistent)  # taken by the consumer below: unacked
    ch.basic_publish("", classic, b"second", pika.BasicProperties(delivery_mode=2, timestamp=1_700_000_100))
    ch.basic_publish("", classic, b"third")  # transient, no timestamp
    ch.basic_publish("", quorum, b"q", persistent)
    for _ in range(2):
        ch.basic_publish("", stream, b"s", persistent)
    ch.basic_qos(prefetch_count=1)
    ch.basic_consume(classic, lambda *a: None)  # prefetch full after one delivery: no capacity now
    owner = conn.channel()
    exclusive = owner.queue_declare("", exclusive=True).method.queue
    owner.basic_consume(exclusive, lambda *a: None, exclusive=True, consumer_tag="sole")
    port = conn._impl._transport._sock.getsockname()[1]
    conn_name = next(c["name"] for c in http_call(broker, "GET", "/api/connections")[1] if c["peer_port"] == port)
    wait_until(lambda: http_call(broker, "GET", f"/api/queues/%2F/{classic}")[1]["messages_unacknowledged"] == 1,
               what="the consumer's delivery", pause=lambda t: conn.process_data_events(time_limit=t))

    lines = ctl(broker, "-s", "list_queues", *QUEUE_COLUMNS).stdout.splitlines()
    rows = {cells[0]: dict(zip(QUEUE_COLUMNS, cells, strict=True)) for cells in (line.split("\t") for line in lines)}
    node = rows[classic]["pid"][1:-1]
    assert node.startswith("lavinpy@")
    common = {"auto_delete": "false", "policy": "", "pid": f"<{node}>", "state": "running",
              "message_bytes": "", "message_bytes_ready": "", "message_bytes_unacknowledged": "",
              "message_bytes_ram": "", "message_bytes_persistent": "", "disk_reads": "", "disk_writes": "",
              "slave_pids": "", "synchronised_slave_pids": "", "mirror_pids": "", "synchronised_mirror_pids": ""}
    unowned = {"owner_pid": "", "exclusive": "false", "exclusive_consumer_pid": "", "exclusive_consumer_tag": ""}
    replicated = {"leader": node, "members": f'["{node}"]', "online": f'["{node}"]'}
    unreplicated = {"leader": "", "members": "", "online": ""}
    no_consumer = {"consumers": "0", "consumer_utilisation": "", "consumer_capacity": "0"}

    def counts(ready: int, unacked: int) -> dict[str, str]:
        return {"messages_ready": str(ready), "messages_unacknowledged": str(unacked), "messages": str(ready + unacked),
                "messages_ready_ram": str(ready), "messages_unacknowledged_ram": str(unacked),
                "messages_ram": str(ready + unacked)}

    expected = {
        classic: {**common, **unowned, **unreplicated, **counts(2, 1), "name": classic, "durable": "true",
                  "arguments": "{}", "type": "classic", "messages_persistent": "2",
                  "head_message_timestamp": "1700000100", "consumers": "1", "consumer_utilisation": "0.0",
                  "consumer_capacity": "0.0"},
        exclusive: {**common, **unreplicated, **counts(0, 0), "name": exclusive, "durable": "false",
                    "arguments": "{}", "type": "classic", "owner_pid": conn_name, "exclusive": "true",
                    "exclusive_consumer_pid": f"<{node}>", "exclusive_consumer_tag": "sole",
                    "messages_persistent": "0", "head_message_timestamp": "", "consumers": "1",
                    "consumer_utilisation": "1.0", "consumer_capacity": "1.0"},
        quorum: {**common, **unowned, **replicated, **no_consumer, **counts(1, 0), "name": quorum, "durable": "true",
                 "arguments": '{"x-queue-type":"quorum"}', "type": "quorum", "messages_persistent": "1",
                 "head_message_timestamp": "1700000000"},
        stream: {**common, **unowned, **replicated, **no_consumer, **counts(2, 0), "name": stream, "durable": "true",
                 "arguments": '{"x-queue-type":"stream"}', "type": "stream", "messages_persistent": "",
                 "head_message_timestamp": "", "memory": ""},
    }
    for name, want in expected.items():
        got = rows[name]
        if "memory" not in want:  # the index's bytes: 8 per ready position and the unacked set
            assert int(got["memory"]) >= 8 * int(want["messages_ready"]), name
            want = {**want, "memory": got["memory"]}
        assert got == want, name
    # the same figures in the management API, where rabbitmqadmin and dashboards read them
    _, info, _ = http_call(broker, "GET", f"/api/queues/%2F/{classic}")
    figures = (info["messages_persistent"], info["head_message_timestamp"], info["consumer_capacity"])
    assert figures == (2, 1700000100, 0.0)


def test_connection_channel_consumer_and_vhost_columns(broker, clients):
    conn, ch = clients.channel()
    port = conn._impl._transport._sock.getsockname()[1]
    queue = clients.track_queue(_name("cols"))
    ch.queue_declare(queue)
    ch.basic_publish("", queue, b"x" * 1000)
    ch.basic_consume(queue, lambda *a: None, consumer_tag="cols-consumer")
    tx = conn.channel()
    tx.tx_select()
    tx.basic_publish("", queue, b"held")
    tx.basic_publish("", queue, b"held")
    conn.process_data_events(time_limit=0.3)
    before = int(time.time() * 1000)
    connections = json.loads(ctl(broker, "-f", "json", "list_connections", "peer_port", "connected_at", "recv_oct",
                                 "send_oct", "recv_cnt", "send_cnt", "ssl", "ssl_protocol", "pid").stdout)
    mine = next(c for c in connections if c["peer_port"] == port)
    assert 0 < before - mine["connected_at"] < 60_000
    assert mine["recv_oct"] > 1000 and mine["send_oct"] > 1000 and mine["recv_cnt"] > 0 and mine["send_cnt"] > 0
    # A plain connection's text fields are "" (never null: RabbitMQ's rabbitmqadmin cannot print a null).
    assert mine["ssl"] is False and mine["ssl_protocol"] == ""
    channels = json.loads(ctl(broker, "-f", "json", "list_channels", "connection", "number", "transactional",
                              "messages_uncommitted", "acks_uncommitted", "confirm").stdout)
    held = next(c for c in channels if c["connection"].startswith(f"127.0.0.1:{port} ") and c["transactional"])
    assert (held["number"], held["messages_uncommitted"], held["acks_uncommitted"]) == (2, 2, 0)
    consumers = json.loads(ctl(broker, "-f", "json", "list_consumers", "consumer_tag", "channel_pid",
                               "activity_status").stdout)
    ours = next(c for c in consumers if c["consumer_tag"] == "cols-consumer")
    assert ours["channel_pid"] == mine["pid"] and ours["activity_status"] == "up"
    vhosts = json.loads(ctl(broker, "-f", "json", "list_vhosts", "name", "cluster_state", "tracing", "metadata").stdout)
    node = mine["pid"][1:-1]
    metadata = {"description": "", "tags": [], "default_queue_type": "classic"}
    assert {"name": "/", "cluster_state": {node: "running"}, "tracing": False, "metadata": metadata} in vhosts


def test_version_ping_and_await_startup(broker):
    version = ctl(broker, "--version")
    assert version.returncode == 0 and version.stdout.strip() == __version__
    ping = ctl(broker, "ping")
    assert ping.returncode == 0 and ping.stdout.splitlines()[-1] == "Ping succeeded"
    assert ctl(broker, "-q", "ping").stdout == "Ping succeeded\n"
    assert ctl(broker, "ping", password="wrong").returncode == 0  # the node answered: it is up
    down = f"http://guest:guest@127.0.0.1:{free_port()}"
    assert ctl(broker, "ping", uri=down).returncode == 69
    assert ctl(broker, "await_startup").returncode == 0
    started = time.monotonic()
    waited = ctl(broker, "await_startup", "--timeout", "1", uri=down)
    assert waited.returncode == 75 and "did not start" in waited.stderr  # rabbitmqctl's EX_TEMPFAIL
    assert 0.9 < time.monotonic() - started < 20


@lavinpy_only("stops and starts the broker")
def test_await_startup_returns_once_the_broker_starts(fresh_broker):
    b = fresh_broker
    b.stop()
    env_uri = b.http_url.replace("http://", "http://guest:guest@")
    waiter = subprocess.Popen([sys.executable, "-m", "lavinpy.cli.ctl", "--uri", env_uri, "await_startup", "-t", "60"],
                              env={"PYTHONPATH": str(REPO_ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        time.sleep(1.0)
        assert waiter.poll() is None  # still waiting: nothing answers
        b.start()
        assert waiter.wait(timeout=30) == 0, waiter.stderr.read() if waiter.stderr else ""
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()


def test_list_user_permissions_and_list_permissions(fresh_broker):
    b = fresh_broker
    vhost = _name("perm")
    assert ctl(b, "add_vhost", vhost).returncode == 0
    assert ctl(b, "add_user", "frank", "pw").returncode == 0
    assert ctl(b, "set_permissions", "frank", "^f-", ".*", "").returncode == 0
    assert ctl(b, "-p", vhost, "set_permissions", "frank", ".*", "", ".*").returncode == 0
    listed = ctl(b, "list_user_permissions", "frank").stdout.splitlines()
    assert listed[:2] == ['Listing permissions for user "frank" ...', "vhost\tconfigure\twrite\tread"]
    assert sorted(ctl(b, "-s", "list_user_permissions", "frank").stdout.splitlines()) == \
        sorted(["/\t^f-\t.*\t", f"{vhost}\t.*\t\t.*"])
    as_json = json.loads(ctl(b, "-f", "json", "list_user_permissions", "frank").stdout)
    assert {"vhost": vhost, "configure": ".*", "write": "", "read": ".*"} in as_json
    missing = ctl(b, "list_user_permissions", "nobody")
    assert missing.returncode == 1 and "404" in missing.stderr
    in_vhost = ctl(b, "-q", "-p", vhost, "list_permissions").stdout.splitlines()
    assert in_vhost[0] == "user\tconfigure\twrite\tread" and "frank\t.*\t\t.*" in in_vhost


def _closed_with(conn: pika.BlockingConnection) -> tuple[int, str]:
    try:
        for _ in range(100):
            conn.process_data_events(time_limit=0.05)
    except pika.exceptions.ConnectionClosedByBroker as e:
        return e.reply_code, e.reply_text
    return 0, ""


def test_close_all_connections(fresh_broker):
    b = fresh_broker
    vhost = _name("closing")
    assert ctl(b, "add_vhost", vhost).returncode == 0  # the creator (guest) may use it at once
    in_default = [pika.BlockingConnection(pika.URLParameters(b.url)) for _ in range(3)]
    elsewhere = pika.BlockingConnection(pika.URLParameters(b.url_for("guest", "guest", vhost)))
    try:
        started = time.monotonic()
        done = ctl(b, "close_all_connections", "-p", "/", "--limit", "2", "--per-connection-delay", "300",
                   "maintenance")
        assert done.returncode == 0, done.stderr
        assert time.monotonic() - started >= 0.3  # one delay between the two closures
        assert done.stdout.splitlines() == ["Closing all connections in vhost /, reason: maintenance...",
                                            "Closed 2 connections"]
        results = [_closed_with(c) for c in in_default]
        assert sorted(results)[1:] == [(320, "CONNECTION_FORCED - maintenance")] * 2
        assert elsewhere.is_open
        done = ctl(b, "-q", "close_all_connections", "--global", "all of them")
        assert done.stdout == "Closed 2 connections\n"
        assert _closed_with(elsewhere) == (320, "CONNECTION_FORCED - all of them")
        status, connections, _ = http_call(b, "GET", "/api/connections")
        assert status == 200 and connections == []
    finally:
        for conn in [*in_default, elsewhere]:
            try:
                if conn.is_open:
                    conn.close()
            except pika.exceptions.AMQPError:
                pass  # closed by the broker meanwhile


def test_cluster_status_on_a_single_node(broker):
    status, nodes, _ = http_call(broker, "GET", "/api/nodes")
    node = nodes[0]["name"]
    done = ctl(broker, "cluster_status")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"Cluster status of node {node} ..."
    running = lines.index("Running Nodes")
    assert lines[running + 2] == node
    as_json = json.loads(ctl(broker, "-f", "json", "cluster_status").stdout)
    assert as_json["running_nodes"] == [node] and as_json["disk_nodes"] == [node]
    assert list(as_json["versions"]) == [node]


@pytest.mark.parametrize("fmt", ["json", "table"])
def test_status_shows_the_node(broker, fmt):
    done = ctl(broker, "-f", fmt, "status")
    assert done.returncode == 0, done.stderr
    _, overview, _ = http_call(broker, "GET", "/api/overview")
    if fmt == "table":
        assert f"version: {overview['product_version']}" in done.stdout.splitlines()
        assert "alarms: ok" in done.stdout
        return
    info = json.loads(done.stdout)
    assert info["version"] == overview["product_version"] and info["node"] == overview["node"]
    assert info["uptime_seconds"] >= 0 and info["memory_used"] > 0 and info["memory_limit"] > info["memory_used"]
    assert info["disk_free"] > 0 and info["disk_free_limit"] > 0
    assert not info["memory_alarm"] and not info["disk_free_alarm"]
    assert 0 < info["file_descriptors_used"] < info["file_descriptors_total"]
    assert any(x.startswith("amqp ") and x.endswith(f":{broker.port}") for x in info["listeners"])
    assert info["alarms"] == "ok" and info["alarm_list"] == []


def test_authenticate_user_and_clear_password(fresh_broker):
    b = fresh_broker
    assert ctl(b, "add_user", "gina", "pw").returncode == 0  # no tags: no management API access
    assert ctl(b, "set_permissions", "gina", ".*", ".*", ".*").returncode == 0
    ok = ctl(b, "authenticate_user", "gina", "pw")
    assert ok.returncode == 0 and ok.stdout.splitlines() == ['Authenticating user "gina" ...', "Success"]
    wrong = ctl(b, "authenticate_user", "gina", "nope")
    assert wrong.returncode == 1 and 'failed to authenticate user "gina"' in wrong.stderr
    assert ctl(b, "authenticate_user", "nobody", "pw").returncode == 1
    assert ctl(b, "authenticate_user", "guest", "guest").returncode == 0  # an administrator too
    pika.BlockingConnection(pika.URLParameters(b.url_for("gina", "pw"))).close()
    assert ctl(b, "clear_password", "gina").returncode == 0
    assert ctl(b, "authenticate_user", "gina", "pw").returncode == 1
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        pika.BlockingConnection(pika.URLParameters(b.url_for("gina", "pw")))
    assert json.loads(ctl(b, "-f", "json", "list_user_permissions", "gina").stdout)[0]["configure"] == ".*"
