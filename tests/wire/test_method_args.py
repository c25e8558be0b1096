"""decode_arguments against pamqp's own unmarshal: the same slots for every method pamqp knows, and every
truncation or leftover byte refused (pamqp decodes those silently)."""

from __future__ import annotations

import datetime
import random
import struct
from decimal import Decimal

import pytest
from pamqp import commands
from pamqp import decode as pamqp_decode

from lavinpy.wire.accel import cwire
from lavinpy.wire.field_table import FieldTableError, encode_table, validate_table
from lavinpy.wire.method_args import args_table_py, decimal_value, decode_arguments, timestamp_value

_compiled = cwire.args_table if cwire is not None else None

METHODS = sorted(commands.INDEX_MAPPING.items())
INTS = {"octet": ">B", "short": ">H", "long": ">I", "longlong": ">q"}

# Values whose decoding pamqp and the broker's codec agree on (the codec encodes ints as I or l, floats as d).
TABLE = {
    "x-max-length": 10, "x-big": 1 << 40, "x-neg": -7, "flag": True, "off": False, "text": "héllo",
    "ratio": 0.25, "price": Decimal("12.34"), "none": None, "raw": b"\x00\xff",
    "when": datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.UTC),
    "nested": {"a": [1, "two", {"three": 3.5}], "b": {}}, "list": [], "ünï": "key not ASCII",
}


def _value_for(kind: str, rng: random.Random) -> object:
    if kind == "bit":
        return rng.random() < 0.5
    if kind == "octet":
        return rng.randrange(256)
    if kind == "short":
        return rng.randrange(1 << 16)
    if kind == "long":
        return rng.randrange(1 << 32)
    if kind == "longlong":
        return rng.randrange(-(1 << 63), 1 << 63)
    if kind == "shortstr":
        return rng.choice(["", "q", "amq.gen-é", "x" * 255])
    if kind == "longstr":
        return rng.choice(["", "text", "ü" * 300])
    assert kind == "table"
    return rng.choice([{}, TABLE, {"k": rng.randrange(100)}])


def _payload(cls: type, rng: random.Random) -> bytes:
    """Arguments of random values laid out by hand (pamqp's marshal refuses values a server may send)."""
    out = bytearray()
    bit = 8
    for name in cls.__slots__:
        kind = cls.amqp_type(name)
        value = _value_for(kind, rng)
        if kind == "bit":
            if bit == 8:
                out.append(0)
                bit = 0
            out[-1] |= value << bit
            bit += 1
            continue
        bit = 8
        if kind in INTS:
            out += struct.pack(INTS[kind], value)
        elif kind == "shortstr":
            data = value.encode()
            out += bytes((len(data),)) + data
        elif kind == "longstr":
            data = value.encode()
            out += struct.pack(">I", len(data)) + data
        else:
            out += encode_table(value)
    return bytes(out)


@pytest.mark.parametrize(("index", "cls"), METHODS, ids=[cls.name for _, cls in METHODS])
def test_every_method_decodes_as_pamqp_does(index: int, cls: type) -> None:
    rng = random.Random(index)
    for _ in range(20):
        payload = _payload(cls, rng)
        ours = decode_arguments(cls, payload, 0, len(payload))
        theirs = cls.__new__(cls)
        theirs.unmarshal(payload)
        for name in cls.__slots__:
            assert _same(getattr(ours, name), getattr(theirs, name)), (cls.name, name)


@pytest.mark.parametrize(("index", "cls"), METHODS, ids=[cls.name for _, cls in METHODS])
def test_a_truncated_or_overlong_payload_is_refused(index: int, cls: type) -> None:
    payload = _payload(cls, random.Random(index))
    decode_arguments(cls, payload, 0, len(payload))
    with pytest.raises(ValueError):
        decode_arguments(cls, payload + b"\x00", 0, len(payload) + 1)
    for cut in range(len(payload)):
        try:
            decode_arguments(cls, payload[:cut], 0, cut)
        except ValueError:
            continue
        # A prefix can only be complete when the fields after it take no bytes (none: they all do).
        pytest.fail(f"{cls.name}: a payload cut to {cut} of {len(payload)} bytes was accepted")


def test_bits_pack_eight_to_an_octet_and_restart_after_another_field() -> None:
    declare = commands.Queue.Declare(queue="q", passive=True, durable=False, exclusive=True,
                                     auto_delete=True, nowait=False, arguments={"a": 1})
    payload = declare.marshal()
    ours = decode_arguments(commands.Queue.Declare, payload, 0, len(payload))
    bits = (ours.passive, ours.durable, ours.exclusive, ours.auto_delete, ours.nowait)
    assert bits == (True, False, True, True, False)


def test_a_long_string_not_utf8_is_bytes_and_a_short_one_is_refused() -> None:
    start_ok = b"\x00\x00\x00\x00" + b"\x05PLAIN" + b"\x00\x00\x00\x02\xff\xfe" + b"\x05en_US"
    ours = decode_arguments(commands.Connection.StartOk, start_ok, 0, len(start_ok))
    assert ours.response == b"\xff\xfe"
    bad_locale = start_ok[:-6] + b"\x02\xff\xfe"
    with pytest.raises(ValueError):
        decode_arguments(commands.Connection.StartOk, bad_locale, 0, len(bad_locale))


def test_a_refused_table_names_the_argument() -> None:
    declare = b"\x00\x00\x01q\x00" + encode_table({"x": 1})
    broken = declare[:-5] + b"?" + declare[-4:]  # the value's type letter
    with pytest.raises(FieldTableError) as info:
        decode_arguments(commands.Queue.Declare, broken, 0, len(broken))
    assert info.value.path[:2] == ["arguments", "x"]


def test_an_argument_table_of_many_entries_decodes_whole() -> None:
    arguments = {f"k{i}": i for i in range(11_000)}
    payload = commands.Queue.Declare(queue="q", arguments=arguments).marshal()
    ours = decode_arguments(commands.Queue.Declare, payload, 0, len(payload))
    assert ours.arguments == arguments and ours.queue == "q"


def _random_value(rng: random.Random, depth: int) -> bytes:
    """One tagged value of any type RabbitMQ has, nested up to ``depth`` more levels."""
    tag = rng.choice("VtbBsuIilLfdDTSxFA" if depth else "VtbBsuIilLfdDTSx")
    if tag in "FA":
        count = rng.randrange(4)
        if tag == "F":
            body = b"".join(_random_key(rng) + _random_value(rng, depth - 1) for _ in range(count))
        else:
            body = b"".join(_random_value(rng, depth - 1) for _ in range(count))
        return tag.encode() + struct.pack(">I", len(body)) + body
    if tag in "Sx":
        data = rng.choice([b"", b"text", "ü".encode(), b"\xff\xfe", bytes(rng.randrange(256) for _ in range(9))])
        return tag.encode() + struct.pack(">I", len(data)) + data
    width = {"V": 0, "t": 1, "b": 1, "B": 1, "s": 2, "u": 2, "I": 4, "i": 4, "f": 4, "D": 5, "l": 8, "L": 8,
             "d": 8, "T": 8}[tag]
    raw = bytes(rng.randrange(256) for _ in range(width))
    if tag == "T" and rng.random() < 0.7:
        raw = struct.pack(">Q", rng.randrange(253402300799 + 10))
    if tag in "fd" and rng.random() < 0.5:
        raw = struct.pack(">f" if tag == "f" else ">d", rng.uniform(-1e6, 1e6))
    return tag.encode() + raw


def _random_key(rng: random.Random) -> bytes:
    key = rng.choice([b"", b"k", b"x-arg", "ключ".encode(), b"\xff", b"k" * 255, b"dup"])
    return bytes((len(key),)) + key


def _same(a: object, b: object) -> bool:
    """Equal values of equal types, NaNs alike (a float32 NaN's payload becomes a double's either way)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return struct.pack(">d", a) == struct.pack(">d", b) or (a != a and b != b)  # noqa: PLR0124
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)  # type: ignore[index]
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))  # type: ignore[arg-type]
    return a == b


def _pamqp_table(buf: bytes, pos: int, end: int) -> object:
    """pamqp's own reading of the table buf[pos:end] (after its length), or the exception it raises."""
    try:
        return pamqp_decode.field_table(struct.pack(">I", end - pos) + buf[pos:end])[1]
    except Exception as err:  # noqa: BLE001 - what it raises is the comparison
        return type(err)


def _twin_table(buf: bytes, pos: int, end: int) -> object:
    try:
        validate_table(buf, pos, end)
        return args_table_py(buf, pos, end)
    except Exception as err:  # noqa: BLE001
        return type(err)


def _compiled_table(buf: bytes, pos: int, end: int) -> object:
    """The compiled reading of buf[pos:end]: the table, None (left to the twin), or the exception's type."""
    try:
        return _compiled(buf, pos, end, timestamp_value, decimal_value)
    except Exception as err:  # noqa: BLE001 - what it raises is the comparison
        return type(err)


def _random_table(rng: random.Random, depth: int) -> bytes:
    return b"".join(_random_key(rng) + _random_value(rng, depth) for _ in range(rng.randrange(6)))


def test_the_python_table_reads_as_pamqp_does() -> None:
    rng = random.Random(5)
    for _ in range(3000):
        body = _random_table(rng, 3)
        buf = b"\x00\x01" + body + b"\x02"  # not at the buffer's start, not to its end
        ours, theirs = _twin_table(buf, 2, 2 + len(body)), _pamqp_table(buf, 2, 2 + len(body))
        if theirs is UnicodeDecodeError or ours in (OverflowError, OSError, ValueError):
            assert ours is theirs or issubclass(theirs, ValueError | OverflowError | OSError), body
        else:
            assert _same(ours, theirs), body


@pytest.mark.skipif(_compiled is None, reason="the compiled codec is not built")
def test_the_compiled_table_reads_as_the_python_twin() -> None:
    rng = random.Random(7)
    for _ in range(3000):
        body = _random_table(rng, 3)
        buf = b"\x00\x01" + body + b"\x02"
        end = 2 + len(body)
        compiled = _compiled_table(buf, 2, end)
        twin = _twin_table(buf, 2, end)
        if compiled is None:  # left to the twin: only what the twin refuses
            assert isinstance(twin, type) and issubclass(twin, ValueError), body
        else:
            assert _same(compiled, twin), body


@pytest.mark.skipif(_compiled is None, reason="the compiled codec is not built")
def test_the_compiled_table_leaves_every_bad_table_to_the_twin() -> None:
    """Each cut and each bad byte: None from C exactly where validation refuses the table."""
    rng = random.Random(11)
    for _ in range(300):
        body = b"".join(_random_key(rng) + _random_value(rng, 2) for _ in range(1 + rng.randrange(4)))
        variants = [body[:cut] for cut in range(len(body))]
        for _ in range(20):
            at = rng.randrange(len(body))
            variants.append(body[:at] + bytes((rng.randrange(256),)) + body[at + 1:])
        for data in variants:
            buf = data + b"V"  # a good value just past the end, not to be read
            compiled = _compiled_table(buf, 0, len(data))
            twin = _twin_table(buf, 0, len(data))
            if isinstance(twin, type):
                assert compiled is None or compiled is twin, data
            else:
                assert _same(compiled, twin), data
    deep = b"F\x00\x00\x00\x00"
    for _ in range(70):
        deep = b"F" + struct.pack(">I", len(deep) + 2) + b"\x01k" + deep
    nested = b"\x01k" + deep
    assert _compiled_table(nested, 0, len(nested)) is None
    with pytest.raises(FieldTableError):
        validate_table(nested, 0, len(nested))
