"""docs/arguments.md walked: every refused queue, exchange, consumer argument and policy key is refused
with 406 (a policy: PolicyError) naming it, every honoured one is accepted with its example value, a
definitions import reports a refused one, and the code's one table lists the same refusals as the doc."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest

from lavinpy.broker.errors import PRECONDITION_FAILED, BrokerChannelError
from lavinpy.broker.ops import objects
from lavinpy.broker.ops.definitions.checks import DefinitionsError
from lavinpy.broker.ops.definitions.documents import import_definitions
from lavinpy.broker.settings.arguments import ArgumentError, validate_consumer_arguments
from lavinpy.broker.settings.policies import PolicyError
from lavinpy.broker.settings.refused_arguments import REFUSED
from tests.broker.model_harness import OWNER, Model

DOC = Path(__file__).resolve().parents[2] / "docs" / "arguments.md"
_ROW = re.compile(r"^\| `([^`]+)`(?: / `[^`]+`)? \| (\w+) \| ([RL ]+|lavinpy) \| ([^|]+) \| `([^`]*)` \| \*\*(\w+)\*\*")
_names = itertools.count()


def _rows() -> list[tuple[str, str, str, dict[str, Any], str]]:
    rows = []
    for line in DOC.read_text().splitlines():
        match = _ROW.match(line)
        if match:
            name, kind, _, on, example, status = match.groups()
            assert status in ("honoured", "refused"), line
            rows.append((name, kind, on.split()[0], json.loads(example), status))
    return rows


ROWS = _rows()
WALKED = [row for row in ROWS if row[1] != "header"]


def test_the_doc_has_the_rows():
    assert len(ROWS) > 60
    kinds = {kind for _, kind, _, _, _ in ROWS}
    assert kinds == {"queue", "exchange", "consumer", "policy", "header"}


def test_the_code_refuses_what_the_doc_refuses():
    documented = {(name, kind) for name, kind, _, _, status in WALKED if status == "refused"}
    coded = {(r.name, kind) for r in REFUSED for kind in r.kinds}
    assert documented == coded


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    m = Model(tmp_path_factory.mktemp("arguments"))
    objects.declare_exchange(None, m.vhost, "dlx", "fanout")
    objects.declare_exchange(None, m.vhost, "ae", "fanout")
    objects.declare_queue(None, m.vhost, "a-stream", owner=OWNER, durable=True,
                          arguments={"x-queue-type": "stream"})
    objects.declare_queue(None, m.vhost, "a-classic", owner=OWNER)
    yield m
    m.close()


def _declare(model: Model, name: str, kind: str, on: str, example: dict[str, Any]) -> None:
    vhost = model.vhost
    unique = f"{name}-{next(_names)}"
    if kind == "queue":
        durable = example.get("x-queue-type", "classic") != "classic"
        objects.declare_queue(None, vhost, unique, owner=OWNER, durable=durable, arguments=dict(example))
    elif kind == "exchange":
        objects.declare_exchange(None, vhost, unique, on, arguments=dict(example))
    elif kind == "consumer":
        queue = vhost.get_queue("a-stream" if on == "stream" else "a-classic")
        try:  # as basic.consume checks them, then the queue
            validate_consumer_arguments(dict(example), queue=queue.name, vhost=vhost.name)
        except ArgumentError as e:
            raise BrokerChannelError(PRECONDITION_FAILED, e.text) from None
        queue.validate_consumer(False, 10, dict(example))
    else:
        vhost.policies.set(unique, f"^{re.escape(unique)}$", dict(example), apply_to=on)


@pytest.mark.parametrize(("name", "kind", "on", "example", "status"), WALKED,
                         ids=[f"{kind}:{name}" for name, kind, *_ in WALKED])
def test_each_row(model, name, kind, on, example, status):
    if status == "honoured":
        _declare(model, name, kind, on, example)
        return
    if kind == "policy":
        with pytest.raises(PolicyError, match=f"'{re.escape(name)}' is not supported by lavinpy"):
            _declare(model, name, kind, on, example)
        return
    with pytest.raises(BrokerChannelError) as refused:
        _declare(model, name, kind, on, example)
    assert refused.value.kind is PRECONDITION_FAILED
    assert f"invalid arg '{name}'" in refused.value.text and "not supported by lavinpy (" in refused.value.text


@pytest.mark.parametrize(("name", "value"), [("x-delayed-retry-type", "disabled"),
                                             ("x-message-deduplication", False)])
def test_a_value_that_asks_for_nothing_is_accepted(model, name, value):
    objects.declare_queue(None, model.vhost, f"inert-{next(_names)}", owner=OWNER, durable=True,
                          arguments={"x-queue-type": "quorum", name: value})


def test_an_undocumented_x_argument_stays_accepted(model):
    objects.declare_queue(None, model.vhost, "custom", owner=OWNER, arguments={"x-my-app-tag": "blue"})


def test_a_definitions_import_reports_a_refused_argument(model):
    doc = {"exchanges": [{"name": "delayed-flag", "vhost": "/", "type": "direct", "durable": True,
                          "auto_delete": False, "internal": False, "arguments": {"x-delayed-exchange": True}}]}
    with pytest.raises(DefinitionsError, match="x-delayed-exchange"):
        import_definitions(model.broker, None, doc)
    assert "delayed-flag" not in model.vhost.exchanges
