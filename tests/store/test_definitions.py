import logging
import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands as c
from pamqp import frame as pamqp_frame

from lavinpy.store.definitions import (
    HEADER,
    DefinitionsFileError,
    DefinitionsLog,
    LoadReport,
    decode_frames,
    decode_log,
    encode_command,
    encode_record,
)

ARGS = {
    "x-message-ttl": 60000,
    "x-max-length": 1,
    "x-dead-letter-exchange": "dlx",
    "x-single-active-consumer": True,
    "x-nested": {"inner": {"deep": "yes", "n": -5, "flag": False}, "big": 2**40},
}


def fields(command):
    return {name: getattr(command, name) for name in command.__slots__}


def same(a, b):
    return type(a) is type(b) and fields(a) == fields(b) and encode_command(a) == encode_command(b)


def assert_state(actual, expected):
    assert len(actual) == len(expected), (actual, expected)
    for got, want in zip(actual, expected, strict=True):
        assert same(got, want), (fields(got), fields(want))


def file_commands(path):
    data = path.read_bytes()
    assert data[:4] == HEADER
    report = LoadReport()
    found = decode_log(data, 2, report)
    assert not report.errors and report.tail is None
    return found


def open_log(path, **kw):
    log = DefinitionsLog(path, **kw)
    state = log.load()
    return log, state


def ex(name, kind="topic", **kw):
    return c.Exchange.Declare(exchange=name, exchange_type=kind, durable=True, **kw)


def q(name, **kw):
    return c.Queue.Declare(queue=name, durable=True, **kw)


def unicode_queue(name):
    # pamqp's constructors reject names outside [a-zA-Z0-9-_.:@#,/+ ] though AMQP allows any UTF-8;
    # the broker gets such commands from pamqp's decoder, which does not check, so set it afterwards.
    command = q("placeholder")
    command.queue = name
    return command


def qbind(queue, exchange, key="", arguments=None):
    return c.Queue.Bind(queue=queue, exchange=exchange, routing_key=key, arguments=arguments)


def xbind(destination, source, key="", arguments=None):
    return c.Exchange.Bind(destination=destination, source=source, routing_key=key, arguments=arguments)


EVERY_KIND = [
    ex("e1", arguments=ARGS),
    c.Exchange.Delete(exchange="gone"),
    xbind("e2", "e1", "a.#", ARGS),
    c.Exchange.Unbind(destination="e2", source="e1", routing_key="x", arguments=ARGS),
    q("q1", arguments=ARGS),
    c.Queue.Delete(queue="gone", if_unused=True, if_empty=True),
    qbind("q1", "e1", "k", ARGS),
    c.Queue.Unbind(queue="q1", exchange="e1", routing_key="z", arguments=ARGS),
]


@pytest.mark.parametrize("command", EVERY_KIND, ids=lambda cmd: type(cmd).__qualname__)
def test_encoding_is_pamqp_frame_and_decodes_back(command):
    encoded = encode_command(command)
    assert encoded == pamqp_frame.marshal(command, 0)
    found, end, problem = decode_frames(encoded, 0)
    assert problem is None and end == len(encoded)
    assert same(found[0], command)


def test_new_file_has_version_header(tmp_path):
    path = tmp_path / "definitions.amqp"
    log, state = open_log(path)
    assert state == []
    assert path.read_bytes() == struct.pack("<I", 2)
    log.close()


def test_round_trip_declares_and_binds(tmp_path):
    path = tmp_path / "definitions.amqp"
    log, _ = open_log(path)
    written = [
        ex("e1", "direct", arguments=ARGS),
        ex("e2", "x-delayed-message", arguments={"x-delayed-type": "fanout"}),
        q("q1", arguments=ARGS),
        q("q2", exclusive=False, auto_delete=True),
        unicode_queue("ünïcode queue/ä"),
        qbind("q1", "e1", "rk", ARGS),
        qbind("q2", "amq.topic", "a.*.c"),
        xbind("e2", "e1", "#", {"x-match": "all", "h": 1}),
    ]
    for command in written:
        log.append(command)
    assert_state(log.current(), written)
    # Durable before close: another reader sees everything.
    assert_state(DefinitionsLog(path).load(), written)
    log.close()
    assert_state(file_commands(path), written)


def test_state_order_is_exchanges_queues_bindings(tmp_path):
    log, _ = open_log(tmp_path / "d")
    log.append(q("q1"))
    log.append(ex("e1"))
    log.append(qbind("q1", "e1"))
    log.append(ex("e2"))
    log.append(q("q2"))
    assert [type(x) for x in log.current()] == [
        c.Exchange.Declare, c.Exchange.Declare, c.Queue.Declare, c.Queue.Declare, c.Queue.Bind
    ]
    log.close()


def test_redeclare_replaces(tmp_path):
    path = tmp_path / "d"
    log, _ = open_log(path)
    log.append(q("q1", arguments={"x-max-length": 1}))
    log.append(q("q1", arguments={"x-max-length": 2}))
    log.close()
    state = DefinitionsLog(path).load()
    assert len(state) == 1 and state[0].arguments == {"x-max-length": 2}


def test_passive_declare_is_not_stored(tmp_path):
    path = tmp_path / "d"
    log, _ = open_log(path)
    log.append(q("q1", arguments={"a": 1}))
    size = path.stat().st_size
    log.append(c.Queue.Declare(queue="q1", passive=True))
    assert path.stat().st_size == size
    assert log.current()[0].arguments == {"a": 1}
    log.close()


def test_queue_delete_removes_queue_and_bindings_to_it(tmp_path):
    path = tmp_path / "d"
    log, _ = open_log(path)
    for command in [ex("e1"), q("q1"), q("q2"), qbind("q1", "e1", "a"), qbind("q1", "e1", "b"),
                    qbind("q2", "e1", "a")]:
        log.append(command)
    log.append(c.Queue.Delete(queue="q1"))
    expected = [ex("e1"), q("q2"), qbind("q2", "e1", "a")]
    assert_state(log.current(), expected)
    log.close()
    assert_state(DefinitionsLog(path).load(), expected)


def test_exchange_delete_removes_bindings_from_and_to_it(tmp_path):
    path = tmp_path / "d"
    log, _ = open_log(path)
    for command in [ex("e1"), ex("e2"), ex("e3"), q("q1"), qbind("q1", "e1"), qbind("q1", "e2"),
                    xbind("e1", "e2"), xbind("e3", "e1"), xbind("e3", "e2")]:
        log.append(command)
    log.append(c.Exchange.Delete(exchange="e1"))
    expected = [ex("e2"), ex("e3"), q("q1"), qbind("q1", "e2"), xbind("e3", "e2")]
    assert_state(log.current(), expected)
    log.close()
    assert_state(DefinitionsLog(path).load(), expected)


def test_exchange_delete_keeps_queue_binding_of_same_named_queue(tmp_path):
    # A queue may share a name with an exchange; deleting the exchange must not unbind the queue.
    log, _ = open_log(tmp_path / "d")
    for command in [ex("same"), ex("other"), q("same"), qbind("same", "other")]:
        log.append(command)
    log.append(c.Exchange.Delete(exchange="same"))
    assert_state(log.current(), [ex("other"), q("same"), qbind("same", "other")])
    log.close()


def test_unbind_needs_matching_key_and_arguments(tmp_path):
    path = tmp_path / "d"
    log, _ = open_log(path)
    tables = [{"x-match": "any", "a": 1}, {"x-match": "any", "a": 2}]
    for command in [ex("h", "headers"), q("q"), ex("e"), qbind("q", "h", "", tables[0]),
                    qbind("q", "h", "", tables[1]), qbind("q", "h", "k"), xbind("e", "h", "r", tables[0])]:
        log.append(command)
    # Same content in a different key order still matches.
    log.append(c.Queue.Unbind(queue="q", exchange="h", routing_key="", arguments={"a": 1, "x-match": "any"}))
    log.append(c.Queue.Unbind(queue="q", exchange="h", routing_key="nope"))  # no such binding
    # Arguments differ: no match.
    log.append(c.Exchange.Unbind(destination="e", source="h", routing_key="r", arguments=tables[1]))
    expected = [ex("h", "headers"), ex("e"), q("q"), qbind("q", "h", "", tables[1]), qbind("q", "h", "k"),
                xbind("e", "h", "r", tables[0])]
    assert_state(log.current(), expected)
    log.append(c.Exchange.Unbind(destination="e", source="h", routing_key="r", arguments=tables[0]))
    assert_state(log.current(), expected[:-1])
    log.close()
    assert_state(DefinitionsLog(path).load(), expected[:-1])


def test_bool_and_int_arguments_are_different_bindings(tmp_path):
    log, _ = open_log(tmp_path / "d")
    log.append(qbind("q", "amq.headers", "", {"h": True}))
    log.append(qbind("q", "amq.headers", "", {"h": 1}))
    log.append(c.Queue.Unbind(queue="q", exchange="amq.headers", routing_key="", arguments={"h": 1}))
    assert_state(log.current(), [qbind("q", "amq.headers", "", {"h": True})])
    log.close()


def test_load_compacts_a_file_holding_deletes(tmp_path):
    path = tmp_path / "d"
    log, _ = open_log(path)
    for command in [ex("e1"), q("q1"), q("q2"), qbind("q1", "e1"), c.Queue.Delete(queue="q2"),
                    c.Queue.Unbind(queue="q1", exchange="e1", routing_key="")]:
        log.append(command)
    log.close()
    assert len(file_commands(path)) == 6
    expected = [ex("e1"), q("q1")]
    reloaded = DefinitionsLog(path)
    assert_state(reloaded.load(), expected)
    assert_state(file_commands(path), expected)
    assert path.stat().st_size == len(HEADER) + sum(len(encode_record(x)) for x in expected)
    assert not (tmp_path / "d.tmp").exists()
    reloaded.append(q("q3"))  # appends go to the new file
    reloaded.close()
    assert_state(file_commands(path), expected + [q("q3")])


def test_load_without_deletes_does_not_rewrite(tmp_path):
    path = tmp_path / "d"
    log, _ = open_log(path)
    log.append(q("q1"))
    log.close()
    inode = path.stat().st_ino
    DefinitionsLog(path).load()
    assert path.stat().st_ino == inode


def test_automatic_compaction_after_compact_deletes_removals(tmp_path):
    path = tmp_path / "d"
    log, _ = open_log(path, compact_deletes=3)
    log.append(ex("e"))
    for i in range(5):
        log.append(q(f"q{i}"))
        log.append(qbind(f"q{i}", "e", "k"))
    log.append(c.Queue.Unbind(queue="q0", exchange="e", routing_key="k"))
    log.append(c.Queue.Delete(queue="q1"))
    assert len(file_commands(path)) == 13  # two removals: not yet
    log.append(c.Queue.Delete(queue="q9"))  # third removal (of nothing) triggers it
    on_disk = file_commands(path)
    assert not any(isinstance(x, (c.Queue.Delete, c.Queue.Unbind)) for x in on_disk)
    assert_state(on_disk, log.current())
    assert len(on_disk) == 1 + 4 + 3
    # The counter restarts after a compaction.
    log.append(c.Queue.Delete(queue="q2"))
    assert len(file_commands(path)) == 1 + 4 + 3 + 1
    log.close()


def test_explicit_compact(tmp_path):
    path = tmp_path / "d"
    log, _ = open_log(path)
    log.append(q("a"))
    log.append(c.Queue.Delete(queue="a"))
    log.append(q("b"))
    log.compact()
    assert_state(file_commands(path), [q("b")])
    log.append(q("c"))
    log.close()
    assert_state(DefinitionsLog(path).load(), [q("b"), q("c")])


@pytest.mark.parametrize("cut", [1, 5, 8, 20])
def test_truncated_tail_is_dropped_and_file_cut_back(tmp_path, cut, caplog):
    path = tmp_path / "d"
    log, _ = open_log(path)
    log.append(ex("e1", arguments=ARGS))
    log.append(q("q1", arguments=ARGS))
    good_size = path.stat().st_size
    log.append(qbind("q1", "e1", "k", ARGS))
    log.close()
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - cut)
    again = DefinitionsLog(path)
    assert_state(again.load(), [ex("e1", arguments=ARGS), q("q1", arguments=ARGS)])
    assert "ignoring" in caplog.text
    assert path.stat().st_size == good_size
    again.append(qbind("q1", "e1", "k2"))
    again.close()
    assert_state(DefinitionsLog(path).load()[2:], [qbind("q1", "e1", "k2")])


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00" * 64,
        b"\xff" * 3,
        b"\x01\x00\x00\x00\x00\x00\x04\x00\x0a\x00\x0a\xce",  # connection.start: not a definition
        b"\x08\x00\x00\x00\x00\x00\x00\xce",  # a heartbeat frame
    ],
    ids=["zeros", "ff", "unknown-method", "heartbeat"],
)
def test_garbage_tail_is_dropped(tmp_path, garbage):
    path = tmp_path / "d"
    log, _ = open_log(path)
    log.append(q("q1"))
    log.close()
    good = path.read_bytes()
    path.write_bytes(good + garbage)
    assert_state(DefinitionsLog(path).load(), [q("q1")])
    assert path.read_bytes() == good


def test_wrong_version_is_a_clear_error(tmp_path):
    path = tmp_path / "definitions.amqp"
    path.write_bytes(struct.pack("<I", 7) + encode_command(q("q1")))
    with pytest.raises(DefinitionsFileError, match=r"definitions.amqp.*version 7"):
        DefinitionsLog(path).load()
    assert path.read_bytes()[:4] == struct.pack("<I", 7)  # left as it was


def test_append_requires_load_and_rejects_other_methods(tmp_path):
    log = DefinitionsLog(tmp_path / "d")
    with pytest.raises(RuntimeError, match="load"):
        log.append(q("q"))
    log.load()
    with pytest.raises(TypeError):
        log.append(c.Basic.Qos(prefetch_count=1))
    log.close()


NAMES = st.sampled_from(["a", "b"])
OPS = st.one_of(
    st.builds(lambda n: ex(n), NAMES),
    st.builds(lambda n, v: q(n, arguments={"v": v}), NAMES, st.integers(0, 2)),
    st.builds(lambda n: c.Exchange.Delete(exchange=n), NAMES),
    st.builds(lambda n: c.Queue.Delete(queue=n), NAMES),
    st.builds(lambda d, s, k: qbind(d, s, k), NAMES, NAMES, st.sampled_from(["", "k"])),
    st.builds(lambda d, s, k: c.Queue.Unbind(queue=d, exchange=s, routing_key=k), NAMES, NAMES,
              st.sampled_from(["", "k"])),
    st.builds(lambda d, s: xbind(d, s, "r"), NAMES, NAMES),
    st.builds(lambda d, s: c.Exchange.Unbind(destination=d, source=s, routing_key="r"), NAMES, NAMES),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(OPS, max_size=30), compact_every=st.integers(1, 5))
def test_replay_always_matches_live_state(tmp_path_factory, ops, compact_every):
    path = tmp_path_factory.mktemp("defs") / "definitions.amqp"
    log, _ = open_log(path, compact_deletes=compact_every)
    for op in ops:
        log.append(op)
    live = log.current()
    log.close()
    replayed = DefinitionsLog(path, compact_deletes=compact_every).load()
    assert_state(replayed, live)
    assert_state(live, reference_state(ops))


def reference_state(ops):
    """The expected state computed the slow, obvious way, independently of DefinitionsLog."""
    exchanges, queues, bindings = {}, {}, []

    def bind_id(b):
        if isinstance(b, (c.Queue.Bind, c.Queue.Unbind)):
            return ("q", b.exchange, b.queue, b.routing_key, repr(sorted((b.arguments or {}).items())))
        return ("x", b.source, b.destination, b.routing_key, repr(sorted((b.arguments or {}).items())))

    for op in ops:
        if isinstance(op, c.Exchange.Declare):
            exchanges[op.exchange] = op
        elif isinstance(op, c.Queue.Declare):
            queues[op.queue] = op
        elif isinstance(op, c.Exchange.Delete):
            exchanges.pop(op.exchange, None)
            bindings = [b for b in bindings if not (
                bind_id(b)[1] == op.exchange or (bind_id(b)[0] == "x" and bind_id(b)[2] == op.exchange))]
        elif isinstance(op, c.Queue.Delete):
            queues.pop(op.queue, None)
            bindings = [b for b in bindings if not (bind_id(b)[0] == "q" and bind_id(b)[2] == op.queue)]
        elif isinstance(op, (c.Queue.Bind, c.Exchange.Bind)):
            ids = [bind_id(b) for b in bindings]
            if bind_id(op) in ids:
                bindings[ids.index(bind_id(op))] = op
            else:
                bindings.append(op)
        else:
            bindings = [b for b in bindings if bind_id(b) != bind_id(op)]
    return [*exchanges.values(), *queues.values(), *bindings]


def write_log(path, commands):
    """Append each command; returns the file offset of each one's record."""
    log, _ = open_log(path)
    offsets = []
    for command in commands:
        offsets.append(path.stat().st_size)
        log.append(command)
    log.close()
    return offsets


def canonical(commands):
    """The order load() returns: exchanges, queues, bindings."""
    kinds = (c.Exchange.Declare, c.Queue.Declare)
    return sorted(commands, key=lambda d: next((i for i, k in enumerate(kinds) if isinstance(d, k)), 2))


DEFS = [ex("e1"), q("q1", arguments=ARGS), q("q2"), qbind("q2", "e1", "k"), ex("e2"), q("q3")]


# A byte flipped at the start, in the middle and at the end of one record, the rest of the file intact.
@pytest.mark.parametrize("where", [0, 1, 3, 5, 9, "middle", "last"])
@pytest.mark.parametrize("victim", [1, 2, 5])
def test_damaged_record_is_skipped_and_the_rest_kept(tmp_path, caplog, where, victim):
    path = tmp_path / "definitions.amqp"
    offsets = write_log(path, DEFS)
    ends = offsets[1:] + [path.stat().st_size]
    start, end = offsets[victim], ends[victim]
    at = {"middle": (start + end) // 2, "last": end - 1}.get(where, start + where if isinstance(where, int) else 0)
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="lavinpy.store.definitions"):
        state = DefinitionsLog(path).load()
    kept = canonical([d for i, d in enumerate(DEFS) if i != victim])
    assert_state(state, kept)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(f"offset {start}" in m for m in errors), errors
    # Rewritten without the damaged record (which is kept in a copy of the file as found).
    assert_state(file_commands(path), kept)
    copies = list(tmp_path.glob("definitions.amqp.damaged-*"))
    assert len(copies) == 1 and copies[0].read_bytes() == bytes(data)


def test_record_that_checks_out_but_does_not_decode_is_skipped(tmp_path, caplog):
    path = tmp_path / "definitions.amqp"
    offsets = write_log(path, DEFS[:2])
    frame = b"\x01\x00\x00\x00\x00\x00\x04\x00\x0a\x00\x0a\xce"  # connection.start: not a definition
    with open(path, "ab") as f:
        f.write(struct.pack("<II", len(frame), zlib.crc32(frame)) + frame)
    bad = path.stat().st_size - len(frame) - 8
    log = DefinitionsLog(path)
    log.load()
    log.append(q("after"))
    log.close()
    with caplog.at_level(logging.ERROR, logger="lavinpy.store.definitions"):
        state = DefinitionsLog(path).load()
    assert_state(state, [DEFS[0], DEFS[1], q("after")])
    assert f"offset {bad}" in caplog.text and offsets


def test_version_1_file_is_read_past_a_bad_frame_and_rewritten(tmp_path, caplog):
    path = tmp_path / "definitions.amqp"
    undecodable = b"\x01\x00\x00\x00\x00\x00\x04\x00\x0a\x00\x0a\xce"  # framed, but not a definition
    damaged = bytearray(encode_command(q("q2")))
    damaged[3] ^= 0xFF  # its frame size: where it ends is unknown
    parts = [struct.pack("<I", 1), encode_command(ex("e1")), undecodable, encode_command(q("q1")),
             bytes(damaged), encode_command(q("q3"))]
    path.write_bytes(b"".join(parts))
    with caplog.at_level(logging.ERROR, logger="lavinpy.store.definitions"):
        state = DefinitionsLog(path).load()
    assert_state(state, [ex("e1"), q("q1"), q("q3")])
    for offset in (len(parts[0]) + len(parts[1]), sum(map(len, parts[:4]))):
        assert f"offset {offset}" in caplog.text
    assert path.read_bytes()[:4] == struct.pack("<I", 2)
    assert_state(file_commands(path), [ex("e1"), q("q1"), q("q3")])


def test_version_1_file_is_rewritten_as_version_2(tmp_path):
    path = tmp_path / "definitions.amqp"
    path.write_bytes(struct.pack("<I", 1) + b"".join(encode_command(d) for d in DEFS))
    assert_state(DefinitionsLog(path).load(), canonical(DEFS))
    assert_state(file_commands(path), canonical(DEFS))
    assert not list(tmp_path.glob("*.damaged-*"))
