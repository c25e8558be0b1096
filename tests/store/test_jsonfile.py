import json

import pytest

from lavinpy.store.jsonfile import read_json, tmp_path_for, write_bytes_atomic, write_json_atomic


def test_missing_file_gives_default(tmp_path):
    sentinel = {"x": [1]}
    assert read_json(tmp_path / "nope.json", sentinel) is sentinel


def test_round_trip_unicode_and_nesting(tmp_path):
    path = tmp_path / "users.json"
    obj = [{"name": "zoë", "tags": ["a", "b"], "n": 3, "ok": True, "perm": {"/": {"read": ".*"}}}]
    write_json_atomic(path, obj)
    assert read_json(path, None) == obj
    assert json.loads(path.read_text(encoding="utf-8")) == obj


def test_replace_leaves_no_tmp_file(tmp_path):
    path = tmp_path / "vhosts.json"
    write_json_atomic(path, [1])
    write_json_atomic(path, [2])
    assert read_json(path, None) == [2]
    assert not tmp_path_for(path).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vhosts.json"]


def test_stale_tmp_file_does_not_affect_reads_and_is_overwritten(tmp_path):
    path = tmp_path / "a.json"
    write_json_atomic(path, {"v": 1})
    tmp_path_for(path).write_text("{half a wri")  # as left by a crash mid-write
    assert read_json(path, None) == {"v": 1}
    write_json_atomic(path, {"v": 2})
    assert read_json(path, None) == {"v": 2}


def test_corrupt_json_raises_value_error_naming_file(tmp_path):
    path = tmp_path / "users.json"
    path.write_text('[{"name": ')
    with pytest.raises(ValueError, match="users.json"):
        read_json(path, [])


def test_invalid_utf8_raises_value_error(tmp_path):
    path = tmp_path / "x.json"
    path.write_bytes(b'"\xff\xfe"')
    with pytest.raises(ValueError, match="x.json"):
        read_json(path, [])


def test_write_bytes_atomic(tmp_path):
    path = tmp_path / "blob"
    write_bytes_atomic(path, b"\x00\x01")
    write_bytes_atomic(path, b"abc")
    assert path.read_bytes() == b"abc"
