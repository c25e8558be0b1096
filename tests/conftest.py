"""Markers by place: every test under tests/cluster, tests/spark or tests/jepsen carries that directory's
marker, and every test that uses the headless browser (the ``browser`` fixture) carries ``browser``, so
that ``-m "not cluster and not spark"`` selects without each module having to say what it is.

``both_paths`` marks the tests that exercise what a compiled extension replaces (the codec, client, stream
and socket-thread modules lavinpy/wire/_c*.c, the store's lavinpy/store/_cstore*.c): the whole suite runs on
the compiled path, and ``LAVINPY_PURE_PYTHON=1 python3 -m pytest -m both_paths`` runs these again on the
pure-Python fallback (.ci/run says why this slice)."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent
DIRECTORY_MARKERS = {HERE / name: name for name in ("cluster", "spark", "jepsen")}
BROWSER_FIXTURE = "browser"
# Under pytest-xdist (-n 2), a group's tests run one after the other on one worker: the Spark tests share one
# local SparkSession (a JVM), and the cluster and fault-injection tests (several nodes and an etcd each,
# failover deadlines) run one at a time, beside the other worker's tests.
SERIAL_GROUPS = {"spark": "spark", "cluster": "nodes", "jepsen": "nodes"}


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """`-n N` alone distributes by group (xdist's loadgroup), so that SERIAL_GROUPS hold; an explicit --dist wins."""
    given = any(arg == "--dist" or arg.startswith("--dist=") for arg in config.invocation_params.args)
    if getattr(config.option, "numprocesses", None) and not given and config.option.dist == "load":
        config.option.dist = "loadgroup"
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
    "mqtt/test_mqtt_sansio.py", "mqtt/test_mqtt_runs.py", "mqtt/test_mqtt_durability.py",
    # lavinpy's own AMQP clients on lavinpy.wire.client (_cclient): Spark's, lavinpy-perf's, the shovels'
    "spark/test_clients.py", "test_perf_tool.py", "shovel/test_shovel_engine.py",
    # every module imports on the path selected
    "test_imports.py",
    # real traffic through a broker process: socket threads, publish/delivery/ack runs, confirms and
    # transactions, restarts and kill -9, streams, large and odd frames, damaged records
    *(f"e2e/test_{name}.py" for name in (
        "codec_path", "socket_threads", "publish_runs", "ack_runs", "delivery_runs", "acks", "confirms_tx",
        "durability", "kill9", "delivery_count_persist", "streams", "large_bodies", "field_values",
        "bad_input", "corruption", "fuzz")),
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
