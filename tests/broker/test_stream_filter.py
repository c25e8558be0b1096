"""The stream filter matcher (broker/queues/stream_filter.py): LavinMQ's forms (string, table, array;
x-filter-match-type; x-stream-match-unfiltered) and RabbitMQ's (a string or an array of strings),
exact: properties over generated filters and messages, then the argument errors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lavinpy.broker.queues.stream_filter import StreamFilterError, stream_filter

WORDS = st.text(st.sampled_from("abcxyz"), min_size=1, max_size=3)
VALUE_SETS = st.frozensets(WORDS, max_size=4)
HEADERS = st.dictionaries(st.sampled_from(["h1", "h2", "h3"]), st.one_of(WORDS, st.integers(0, 3), st.booleans()),
                          max_size=3)


def _message(values: frozenset[str] | None, headers: dict) -> dict:
    out = dict(headers)
    if values is not None:
        out["x-stream-filter-value"] = ",".join(sorted(values))
    return out


@given(wanted=VALUE_SETS.filter(bool), held=VALUE_SETS, match_any=st.booleans())
def test_values_all_or_any(wanted, held, match_any):
    args = {"x-stream-filter": ",".join(sorted(wanted))}
    if match_any:
        args["x-filter-match-type"] = "ANY"
    f = stream_filter(args)
    assert f is not None
    got = f.matches(_message(held if held else None, {}))
    assert got == (bool(wanted & held) if match_any else wanted <= held)


@given(wanted=st.lists(WORDS, min_size=1, max_size=4), held=WORDS)
def test_rabbitmq_array_matches_any_value(wanted, held):
    f = stream_filter({"x-stream-filter": wanted})
    assert f is not None
    assert f.matches({"x-stream-filter-value": held}) == (held in wanted)


@given(pairs=HEADERS.filter(bool), headers=HEADERS, match_any=st.booleans())
def test_table_matches_header_values_as_text(pairs, headers, match_any):
    def text(value):  # AMQP booleans compare as true/false, numbers by their digits
        return str(value).lower() if isinstance(value, bool) else str(value)

    args = {"x-stream-filter": {k: text(v) for k, v in pairs.items()},
            "x-filter-match-type": "any" if match_any else "all"}
    f = stream_filter(args)
    assert f is not None
    hits = [k in headers and text(headers[k]) == text(v) for k, v in pairs.items()]
    assert f.matches(headers) == (any(hits) if match_any else all(hits))


@given(wanted=VALUE_SETS.filter(bool), headers=HEADERS, unfiltered=st.booleans())
def test_untagged_messages_only_with_match_unfiltered(wanted, headers, unfiltered):
    f = stream_filter({"x-stream-filter": sorted(wanted), "x-stream-match-unfiltered": unfiltered})
    assert f is not None
    assert f.matches(headers) == unfiltered
    assert f.matches(None) == unfiltered


@given(held=st.one_of(st.none(), VALUE_SETS), headers=HEADERS)
def test_no_filter_takes_everything(held, headers):
    assert stream_filter({"x-stream-match-unfiltered": False}) is None
    assert stream_filter({}) is None


def test_mixed_array_of_values_and_table_matches_all():
    f = stream_filter({"x-stream-filter": ["foo,bar", {"x-foo": "bar"}]})
    assert f is not None
    assert f.matches({"x-stream-filter-value": "foo,bar", "x-foo": "bar"})
    assert not f.matches({"x-stream-filter-value": "foo,bar"})
    assert not f.matches({"x-stream-filter-value": "foo", "x-foo": "bar"})


@pytest.mark.parametrize(("args", "text"), [
    ({"x-stream-filter": 5}, "x-stream-filter must be a string, table, or array"),
    ({"x-stream-filter": [["nested"]]}, "x-stream-filter must be a string, table, or array"),
    ({"x-stream-filter": "a", "x-filter-match-type": "some"}, "x-filter-match-type must be 'any' or 'all'"),
    ({"x-stream-filter": "a", "x-stream-match-unfiltered": "yes"}, "x-stream-match-unfiltered must be a boolean"),
])
def test_bad_arguments_name_themselves(args, text):
    with pytest.raises(StreamFilterError, match=text):
        stream_filter(args)


def test_header_values_as_decoded_from_the_wire_compare_by_their_digits():
    from lavinpy.wire.field_table import Int8, Int64

    f = stream_filter({"x-stream-filter": {"app": "1", "size": "1000000000000"}})
    assert f is not None
    assert f.matches({"app": Int8(1), "size": Int64(10**12)})
    assert not f.matches({"app": Int8(2), "size": Int64(10**12)})
