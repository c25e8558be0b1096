"""The pytest plugin tested on itself: inner pytest runs (pytester) that use the fixtures with no
configuration of their own, and the cost of the plugin for a project that does not use it."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

PLUGIN = "lavinpy.testing.plugin"


def plugin_args() -> list[str]:
    """What the inner run needs to load the plugin: nothing when the installed lavinpy registered the
    entry point (loading it twice would fail), else the module."""
    registered = any(ep.value == PLUGIN for ep in importlib.metadata.entry_points(group="pytest11"))
    return [] if registered else ["-p", PLUGIN]


def test_the_entry_point_names_the_plugin_module() -> None:
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert pyproject["project"]["entry-points"]["pytest11"] == {"lavinpy": PLUGIN}


def test_fixtures_give_a_broker_and_a_fresh_vhost_per_test(pytester: pytest.Pytester, tmp_path: Path) -> None:
    record = tmp_path / "record.txt"
    pytester.makepyfile(f"""
        import pika
        import pytest

        seen = []

        def publish(url, queue, body):
            connection = pika.BlockingConnection(pika.URLParameters(url))
            channel = connection.channel()
            channel.queue_declare(queue)
            channel.basic_publish("", queue, body)
            connection.close()

        @pytest.mark.parametrize("n", [1, 2])
        def test_round_trip(lavinpy_broker, lavinpy_vhost, n):
            assert lavinpy_vhost.startswith("amqp://guest:guest@127.0.0.1:")
            assert lavinpy_vhost.broker is lavinpy_broker and lavinpy_broker.running()
            assert lavinpy_vhost.user == "guest" and lavinpy_vhost.password == "guest"
            assert lavinpy_vhost.http_url == lavinpy_broker.http_url
            assert lavinpy_vhost.mqtt_port == lavinpy_broker.mqtt_port > 0
            assert lavinpy_broker.data_dir.is_dir()
            # a fresh vhost: nothing from the test before
            assert lavinpy_vhost.queues() == []
            publish(lavinpy_vhost, "work", b"job %d" % n)
            assert lavinpy_vhost.wait_for_messages("work", 1, timeout=10) == 1
            assert [m.body for m in lavinpy_vhost.get("work")] == [b"job %d" % n]
            seen.append(lavinpy_vhost.name)
            with open({str(record)!r}, "a") as out:
                out.write(f"{{lavinpy_broker.amqp_port}} {{lavinpy_broker.workdir}} {{lavinpy_vhost.name}}\\n")

        def test_vhosts_of_earlier_tests_are_gone(lavinpy_broker):
            vhosts = {{v["name"] for v in lavinpy_broker.api.call("GET", "/api/vhosts")}}
            assert len(seen) == 2 and not vhosts & set(seen), vhosts
    """)
    result = pytester.runpytest(*plugin_args(), "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    lines = [line.split() for line in record.read_text().splitlines()]
    ports, workdirs, vhosts = zip(*lines, strict=True)
    assert len(set(ports)) == 1 and len(set(workdirs)) == 1, "one broker for the session"
    assert len(set(vhosts)) == 2
    assert not Path(workdirs[0]).exists(), "the session's broker removes its directory"


def test_a_conftest_may_put_its_own_broker_in_the_fixtures_place(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("""
        import pytest
        from lavinpy.testing import Broker

        @pytest.fixture(scope="session")
        def lavinpy_broker():
            with Broker(mqtt=False) as broker:
                yield broker
    """)
    pytester.makepyfile("""
        def test_without_mqtt(lavinpy_vhost):
            assert lavinpy_vhost.mqtt_port == 0
            assert lavinpy_vhost.queues() == []
    """)
    pytester.runpytest(*plugin_args(), "-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_a_broker_that_cannot_start_fails_the_tests_with_its_log(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("""
        import pytest
        from lavinpy.testing import Broker

        @pytest.fixture(scope="session")
        def lavinpy_broker():
            with Broker(args=["--fsync", "sometimes"]) as broker:
                yield broker
    """)
    pytester.makepyfile("""
        def test_never_runs(lavinpy_vhost):
            pass
    """)
    result = pytester.runpytest(*plugin_args(), "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*BrokerError: lavinpy exited with code 2 while starting*",
                                 "*invalid choice: 'sometimes'*"])


def test_loading_the_plugin_imports_nothing_of_the_broker() -> None:
    """pytest loads the plugin in every project where lavinpy is installed: only the plugin module and the
    packages around it may be imported then."""
    script = ("import sys, pytest; before = set(sys.modules); import lavinpy.testing.plugin; "
              "print(' '.join(sorted(set(sys.modules) - before)))")
    found = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                           cwd=Path(__file__).resolve().parents[2])
    assert found.returncode == 0, found.stderr
    assert found.stdout.split() == ["lavinpy", "lavinpy.testing", "lavinpy.testing.plugin"]
