"""The shovel status API of a lavinpy process, and "amqp://" meaning the local node."""

from __future__ import annotations

import time
import urllib.request

import pika

from tests.e2e.conftest import http_call

from .engine import EngineThread
from .test_shovel_engine import _count, _publish


def test_status_api_of_a_broker(one_broker) -> None:
    a = one_broker
    assert http_call(a, "GET", "/api/shovels")[:2] == (200, [])
    assert http_call(a, "GET", "/api/shovels/%2F")[:2] == (200, [])
    status, body, _ = http_call(a, "DELETE", "/api/shovels/vhost/%2F/nope/restart")
    assert status == 404 and "nope" in body["reason"]
    assert http_call(a, "GET", "/api/shovels/vhost/%2F/nope")[0] == 404


def test_local_uri_is_the_local_node(one_broker) -> None:
    a = one_broker
    engine = EngineThread(local_port=a.port)
    try:
        _publish(a.url, "here", 10)
        engine.apply("local", {"src-uri": "amqp://", "src-queue": "here", "dest-uri": "amqp://",
                               "dest-queue": "there"})
        deadline = time.monotonic() + 10
        while _count(a.url, "here") and time.monotonic() < deadline:
            time.sleep(0.05)
        conn = pika.BlockingConnection(pika.URLParameters(a.url))
        assert conn.channel().queue_declare("there", passive=True).method.message_count == 10
        conn.close()
        assert engine.status("local")["src_uri"] == "amqp://"
    finally:
        engine.close()


def test_ctl_shovel_commands(one_broker, capsys) -> None:
    from lavinpy.cli.ctl import main

    a = one_broker
    uri = f"--uri=http://guest:guest@127.0.0.1:{a.http_port}"
    assert main([uri, "shovel_status"]) == 0
    assert "name\tvhost\ttype\tstate" in capsys.readouterr().out
    assert main([uri, "list_shovels", "-q"]) == 0
    assert main([uri, "delete_shovel", "nope"]) == 65
    assert main([uri, "restart_shovel", "-p", "/", "nope"]) == 65
    assert "was not found" in capsys.readouterr().err
    assert main([uri, "pause_shovel", "nope"]) == 65


def _metrics(broker) -> str:
    with urllib.request.urlopen(broker.metrics_url + "/metrics", timeout=10) as response:
        return response.read().decode()


def _wait(check, what: str, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


def test_pause_and_resume_a_shovel(one_broker, capsys) -> None:
    """LavinMQ's pause and resume (API, lavinpyctl): a paused shovel moves nothing and is listed as paused;
    resumed, it moves what waited."""
    from lavinpy.cli.ctl import main

    a = one_broker
    value = {"src-uri": "amqp://", "src-queue": "p-src", "dest-uri": "amqp://", "dest-queue": "p-dst"}
    assert http_call(a, "PUT", "/api/parameters/shovel/%2F/p", {"value": value})[0] in (201, 204)
    _publish(a.url, "p-src", 10)
    _wait(lambda: _count(a.url, "p-src") == 0 and _count(a.url, "p-dst") == 10, "the first 10 moved")
    uri = f"--uri=http://guest:guest@127.0.0.1:{a.http_port}"
    assert main([uri, "pause_shovel", "p"]) == 0
    _wait(lambda: http_call(a, "GET", "/api/shovels/vhost/%2F/p")[1]["state"] == "paused", "the paused state")
    # The node's link registry, read by the Prometheus endpoint: the shovel paused, its 10 moved.
    assert 'lavinpy_shovel_paused{name="p",vhost="/"} 1.0' in _metrics(a)
    assert 'lavinpy_shovel_messages_forwarded{name="p",vhost="/"} 10.0' in _metrics(a)
    status, body, _ = http_call(a, "PUT", "/api/shovels/%2F/p/pause")
    assert status == 422 and "paused already" in body["reason"]
    _publish(a.url, "p-src", 10)
    time.sleep(0.5)
    assert _count(a.url, "p-src") == 10 and _count(a.url, "p-dst") == 10  # nothing moved while paused
    assert "p\t/\tdynamic\tpaused" in (main([uri, "shovel_status"]), capsys.readouterr().out)[1]
    assert http_call(a, "PUT", "/api/shovels/%2F/p/resume")[0] == 204
    _wait(lambda: _count(a.url, "p-src") == 0 and _count(a.url, "p-dst") == 20, "the waiting 10 moved")
    assert http_call(a, "GET", "/api/shovels/vhost/%2F/p")[1]["state"] == "running"
    assert 'lavinpy_shovel_running{name="p",vhost="/"} 1.0' in _metrics(a)
    assert http_call(a, "PUT", "/api/shovels/%2F/p/resume")[0] == 422
    assert main([uri, "resume_shovel", "p"]) != 0
    assert http_call(a, "PUT", "/api/shovels/%2F/nope/resume")[0] == 404


def _count_if_declared(url: str, queue: str) -> int:
    """Messages in ``queue``; 0 while it does not exist (a shovel paused before it first ran has not
    declared its destination yet)."""
    try:
        return _count(url, queue)
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code != 404:
            raise
        return 0


def test_a_paused_shovel_stays_paused_across_restarts(one_broker) -> None:
    """The pause is stored with the shovel's parameter (RabbitMQ 4.2, LavinMQ 2.5): after kill -9 and a
    clean restart the shovel is still paused and moves nothing; resumed, it moves, and a restart then runs
    it. The mark is not part of the parameter's value or an export."""
    a = one_broker
    value = {"src-uri": "amqp://", "src-queue": "pp-src", "dest-uri": "amqp://", "dest-queue": "pp-dst"}
    assert http_call(a, "PUT", "/api/parameters/shovel/%2F/pp", {"value": value})[0] in (201, 204)
    assert http_call(a, "PUT", "/api/shovels/%2F/pp/pause")[0] == 204
    _publish(a.url, "pp-src", 10)
    # A shovel that was already consuming may still forward what arrives while its stop completes (the
    # pause answers before the links close): what counts is that nothing moves once it has stopped.
    time.sleep(0.5)
    before = (_count(a.url, "pp-src"), _count_if_declared(a.url, "pp-dst"))
    assert sum(before) == 10
    a.kill9()
    a.start()
    assert http_call(a, "GET", "/api/shovels/vhost/%2F/pp")[1]["state"] == "paused"
    time.sleep(0.5)
    assert (_count(a.url, "pp-src"), _count_if_declared(a.url, "pp-dst")) == before  # nothing moved after the restart
    assert http_call(a, "GET", "/api/parameters/shovel/%2F/pp")[1]["value"] == value
    exported = http_call(a, "GET", "/api/definitions")[1]["parameters"]
    assert [p for p in exported if p["name"] == "pp"] and all("paused" not in p for p in exported)
    a.stop()
    a.start()
    assert http_call(a, "GET", "/api/shovels/vhost/%2F/pp")[1]["state"] == "paused"
    assert http_call(a, "PUT", "/api/shovels/%2F/pp/pause")[0] == 422
    assert http_call(a, "PUT", "/api/shovels/%2F/pp/resume")[0] == 204
    _wait(lambda: _count(a.url, "pp-src") == 0 and _count_if_declared(a.url, "pp-dst") == 10, "the waiting 10 moved")
    a.kill9()
    a.start()  # resumed is stored too: running again after the restart
    _publish(a.url, "pp-src", 5)
    _wait(lambda: _count(a.url, "pp-src") == 0 and _count_if_declared(a.url, "pp-dst") >= 15,
          "5 more moved after the restart")
    assert http_call(a, "GET", "/api/shovels/vhost/%2F/pp")[1]["state"] == "running"
