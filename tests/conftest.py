"""Markers by place: every test under tests/cluster, tests/spark or tests/jepsen carries that directory's
marker, and every test that uses the headless browser (the ``browser`` fixture) carries ``browser``, so
that ``-m "not cluster and not spark"`` selects without each module having to say what it is.

``both_paths`` marks the tests that exercise what a compiled extension replaces (the codec, client, stream
and socket-thread modules lavinpy/wire/_c*.c, the store's lavinpy/store/_cstore*.c): the whole suite runs on
the compiled path, and ``LAVINPY_PURE_PYTHON=1 python3 -m pytest -m both_paths`` runs these again on the
pure-Python fallback (.ci/run says why this slice)."""

from __future__ import annotations

import fcntl
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Hypothesis' per-example deadline is a timing assertion: on a loaded 2-core CI machine a slow example is
# the machine, not the code. Properties are checked without it (a test may still set its own).
settings.register_profile("lavinpy", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("lavinpy")

HERE = Path(__file__).parent
DIRECTORY_MARKERS = {HERE / name: name for name in ("cluster", "spark", "jepsen", "federation")}
BROWSER_FIXTURE = "browser"
# Under pytest-xdist (-n 2), a group's tests run one after the other on one worker: the Spark tests share one
# local SparkSession (a JVM); the cluster and fault-injection tests start several nodes and an etcd each.
SERIAL_GROUPS = {"spark": "spark", "cluster": "nodes", "jepsen": "nodes", "federation": "federation"}
# ... and these run with no test beside them on the other worker: their failover and timeout bounds (half
# a second for some) hold on a quiet machine, as in a serial run, not beside another test's broker.
ALONE = ("cluster", "jepsen", "timing")
# ... except these modules of those directories, which assert no failover or timeout bound a test beside them
# could break (their waits are minutes): the full sync of a million messages (checked byte for byte), the
# checker's pure functions.
BESIDE_OTHERS = {HERE / name for name in ("cluster/test_replication_sync.py", "jepsen/test_checker.py")}


# What the compiled twins replace, and the tests that drive it:
BOTH_PATHS = {HERE / name for name in (
    # the codec, the clients' frame runs, socket readers and writers, in process
    "wire",
    # the store: record encoding and CRC, record and run reads, ready lists
    "store",
    # the model over the store and the stream offset stamping, in process
    "broker",
    # the AMQP sessions fed bytes through the codec
    "amqp",
    # the MQTT connection on the model and store, in process and through a broker (publish runs, restarts)
    "mqtt/test_mqtt_sansio.py", "mqtt/test_mqtt_runs.py", "mqtt/test_mqtt_delivery_runs.py",
    "mqtt/test_mqtt_codec_agree.py", "mqtt/test_mqtt_durability.py",
    # lavinpy's own AMQP clients on lavinpy.wire.client (_cclient): Spark's, lavinpy-perf's, the shovels'
    "spark/test_clients.py", "test_perf_tool.py", "shovel/test_shovel_engine.py",
    # every module imports on the path selected
    "test_imports.py",
    # real traffic through a broker process: socket threads, publish/delivery/ack runs, confirms and
    # transactions, restarts and kill -9, streams, large and odd frames, damaged records
    *(f"e2e/test_{name}.py" for name in (
        "codec_path", "socket_threads", "publish_runs", "publish_runs_varied", "ack_runs", "delivery_runs", "acks",
        "confirms_tx",
        "durability", "kill9", "delivery_count_persist", "streams", "large_bodies", "field_values",
        "bad_input", "corruption", "fuzz", "deduplication")),
)}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.path))
        for directory, marker in DIRECTORY_MARKERS.items():
            if directory in path.parents:
                item.add_marker(marker)
                item.add_marker(pytest.mark.xdist_group(SERIAL_GROUPS[marker]))
        if path in BOTH_PATHS or not BOTH_PATHS.isdisjoint(path.parents):
            item.add_marker("both_paths")
        if BROWSER_FIXTURE in getattr(item, "fixturenames", ()):
            item.add_marker("browser")


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Under pytest-xdist, an ALONE test holds the run's lock exclusively, every other test shares it; outside
    every other wrapper, so that waiting for the lock counts toward no test's timeout."""
    workerinput = getattr(item.config, "workerinput", None)
    if workerinput is None:
        yield
        return
    alone = Path(str(item.path)) not in BESIDE_OTHERS and any(item.get_closest_marker(name) for name in ALONE)
    with run_lock(Path(tempfile.gettempdir()) / f"lavinpy-tests-{workerinput['testrunuid']}", alone):
        yield


@contextmanager
def run_lock(base: Path, exclusive: bool) -> Iterator[None]:
    """A readers-writer lock between the workers of one run (flock), writers first: a test waiting to run
    alone holds the turnstile, so no new test starts beside it while the running ones finish."""
    with open(f"{base}.turnstile", "a") as turnstile, open(f"{base}.lock", "a") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
