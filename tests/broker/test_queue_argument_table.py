"""The one table of queue arguments drives declare validation, policy validation, the effective settings
and the arguments each queue type takes: a row changed in the table changes all four."""

from __future__ import annotations

import dataclasses

import pytest

from lavinpy.broker.queues.stream_arguments import STREAM_ARGUMENTS
from lavinpy.broker.settings.arguments import ArgumentError, QueueSettings, validate_queue_arguments
from lavinpy.broker.settings.policies import VALIDATORS, PolicyError, make_policy
from lavinpy.broker.settings.queue_arguments import (
    ARGUMENT_FIRST,
    ARGUMENT_ONLY,
    QUEUE_ARGUMENTS,
    SMALLER,
    int_or_none,
)
from lavinpy.broker.settings.quorum_arguments import OTHER_TYPES_ARGUMENTS, QUORUM_ARGUMENTS

ROWS = {row.argument: row for row in QUEUE_ARGUMENTS}
SETTINGS_FIELDS = {f.name for f in dataclasses.fields(QueueSettings)}


def test_each_argument_has_one_row_and_each_field_one_argument():
    assert len(ROWS) == len(QUEUE_ARGUMENTS)
    fields = [row.field for row in QUEUE_ARGUMENTS if row.field]
    assert len(fields) == len(set(fields))
    assert set(fields) <= SETTINGS_FIELDS
    # what the table does not set: the queue type, the quorum default priority, the policy's name and the
    # delayed-retry policy (five x-delayed-retry-* arguments read together: settings/retries.py)
    assert SETTINGS_FIELDS - set(fields) == {"queue_type", "default_priority", "policy", "retry"}


def test_the_policy_validators_are_the_tables():
    for row in QUEUE_ARGUMENTS:
        if row.policy_key is not None and row.policy_check is not None:
            assert VALIDATORS[row.policy_key] is row.policy_check, row.policy_key


def test_the_queue_types_arguments_are_the_tables_kinds():
    assert {name for name, row in ROWS.items() if "quorum" in row.kinds} == QUORUM_ARGUMENTS
    assert {name for name, row in ROWS.items() if "quorum" not in row.kinds} == OTHER_TYPES_ARGUMENTS
    assert {name for name, row in ROWS.items() if "stream" in row.kinds} == STREAM_ARGUMENTS
    assert "x-max-priority" in OTHER_TYPES_ARGUMENTS and "x-max-length" not in STREAM_ARGUMENTS


def test_declare_checks_run_in_the_tables_order():
    """Two bad arguments: the one earlier in the table is named (RabbitMQ's order)."""
    checked = [row.argument for row in QUEUE_ARGUMENTS if row.declare_check is not None]
    assert checked[:2] == ["x-expires", "x-message-ttl"]
    with pytest.raises(ArgumentError) as refused:
        validate_queue_arguments({"x-message-ttl": -1, "x-expires": 0}, queue="q", vhost="/")
    assert refused.value.name == "x-expires"
    assert refused.value.text == "invalid arg 'x-expires' for queue 'q' in vhost '/': {value_zero,0}"


@pytest.mark.parametrize("row", [r for r in QUEUE_ARGUMENTS if r.precedence == SMALLER and r.value is int_or_none],
                         ids=lambda r: r.argument)
def test_smaller_wins_for_every_numeric_limit(row):
    from_argument = QueueSettings.resolve({row.argument: 5}, {row.policy_key: 7})
    from_policy = QueueSettings.resolve({row.argument: 9}, {row.policy_key: 7})
    assert getattr(from_argument, row.field) == 5
    assert getattr(from_policy, row.field) == 7


@pytest.mark.parametrize("row", [r for r in QUEUE_ARGUMENTS if r.precedence == ARGUMENT_FIRST],
                         ids=lambda r: r.argument)
def test_the_argument_wins_where_the_table_says_so(row):
    argument, policy = ("reject-publish", "drop-head") if row.argument == "x-overflow" else (3, 4)
    if row.value is not int_or_none and row.argument != "x-overflow":
        argument, policy = "from-argument", "from-policy"
    both = QueueSettings.resolve({row.argument: argument}, {row.policy_key: policy})
    policy_only = QueueSettings.resolve({}, {row.policy_key: policy})
    assert getattr(both, row.field) == argument
    assert getattr(policy_only, row.field) == policy


@pytest.mark.parametrize("row", [r for r in QUEUE_ARGUMENTS if r.precedence == ARGUMENT_ONLY],
                         ids=lambda r: r.argument)
def test_an_argument_only_setting_is_no_policy_key(row):
    assert row.policy_key is None
    key = row.argument.removeprefix("x-")
    assert key not in VALIDATORS
    with pytest.raises(PolicyError):
        make_policy("p", ".*", {key: True})


def test_a_policy_value_is_checked_by_its_rows_check():
    with pytest.raises(PolicyError, match="is not a valid message TTL"):
        make_policy("p", ".*", {"message-ttl": -1})
    assert make_policy("p", ".*", {"message-ttl": 0}).definition == {"message-ttl": 0}
