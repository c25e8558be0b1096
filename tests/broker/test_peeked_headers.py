"""``publishing._peeked_headers``: the headers table of a property block publish decodes, the last block's
table kept. Each caller gets a dict of its own, equal to a new decode, whatever an earlier caller did
with its copy; a table with a value a caller could change in place (a CC list) is decoded every time."""

from __future__ import annotations

from lavinpy.broker import publishing
from lavinpy.wire.properties import encode_property_values, peek_headers


def test_each_caller_gets_its_own_copy_of_the_table() -> None:
    block = encode_property_values(delivery_mode=2, headers={"x-mqtt-publish-qos": 1, "name": "v"})
    first = publishing._peeked_headers(block)
    assert first == peek_headers(block) == {"x-mqtt-publish-qos": 1, "name": "v"}
    assert first is not None
    first["BCC"] = ["elsewhere"]  # what a caller may do with its copy (routing's BCC removal copies first)
    del first["name"]
    again = publishing._peeked_headers(bytes(block))  # an equal block, another object
    assert again == {"x-mqtt-publish-qos": 1, "name": "v"} and again is not first
    other = encode_property_values(headers={"x-mqtt-publish-qos": 0})
    assert publishing._peeked_headers(other) == {"x-mqtt-publish-qos": 0}
    assert publishing._peeked_headers(block) == {"x-mqtt-publish-qos": 1, "name": "v"}


def test_a_table_with_a_list_is_decoded_each_time() -> None:
    block = encode_property_values(headers={"CC": ["a", "b"]})
    first = publishing._peeked_headers(block)
    assert first == {"CC": ["a", "b"]}
    assert first is not None
    first["CC"].append("c")
    again = publishing._peeked_headers(block)
    assert again == {"CC": ["a", "b"]} and again["CC"] is not first["CC"]
