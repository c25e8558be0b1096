import hashlib
import subprocess
import sys

import pytest

from lavinpy.store.datadir import DataDir, SchemaVersionError, sha1_name
from lavinpy.store.lock import DataDirLocked


def test_sha1_name_is_lowercase_hex_of_utf8():
    assert sha1_name("/") == hashlib.sha1(b"/").hexdigest()
    assert sha1_name("/").startswith("42099b4a")  # the value DESIGN.md quotes for "/"
    assert sha1_name("zoë") == hashlib.sha1("zoë".encode()).hexdigest()
    assert sha1_name("A") != sha1_name("a")


def test_open_creates_directory_schema_version_and_lock(tmp_path):
    root = tmp_path / "data" / "nested"
    with DataDir(root) as dd:
        assert (root / "schema_version").read_text().strip() == "1"
        assert (root / ".lock").exists()
        assert dd.users_file == root / "users.json"
        assert dd.vhosts_file == root / "vhosts.json"
    # Reopening an existing directory works and keeps the version.
    with DataDir(root):
        assert (root / "schema_version").read_text().strip() == "1"


def test_wrong_schema_version_is_a_clear_error_and_releases_lock(tmp_path):
    (tmp_path / "schema_version").write_text("2\n")
    dd = DataDir(tmp_path)
    with pytest.raises(SchemaVersionError, match=r"schema version '2'.*supports '1'"):
        dd.open()
    assert not dd.lock.held
    assert (tmp_path / "schema_version").read_text() == "2\n"  # left untouched


def test_second_broker_on_same_directory_is_refused(tmp_path):
    child = (
        "import sys; from pathlib import Path; from lavinpy.store.datadir import DataDir\n"
        "DataDir(Path(sys.argv[1])).open()\n"
    )
    with DataDir(tmp_path):
        result = subprocess.run([sys.executable, "-c", child, str(tmp_path)], capture_output=True, text=True)
        assert result.returncode != 0
        assert "is in use by another lavinpy process" in result.stderr
        with pytest.raises(DataDirLocked):
            DataDir(tmp_path).open()


def test_vhost_dirs_round_trip(tmp_path):
    with DataDir(tmp_path) as dd:
        names = ["/", "orders", "zoë/ü", "a" * 255]
        assert dd.vhost_path("orders") == tmp_path / sha1_name("orders")
        assert not dd.vhost_path("orders").exists()  # without create nothing is made
        for name in names:
            path = dd.vhost_path(name, create=True)
            assert path.is_dir()
            assert (path / ".vhost").read_text(encoding="utf-8") == name
        assert dd.vhost_path("orders", create=True) == tmp_path / sha1_name("orders")  # idempotent
        (tmp_path / "not-a-vhost").mkdir()  # directories without .vhost are ignored
        assert dd.vhost_dirs() == {name: tmp_path / sha1_name(name) for name in names}

    with DataDir(tmp_path) as dd:  # survives a restart
        assert set(dd.vhost_dirs()) == set(names)


def test_remove_vhost(tmp_path):
    with DataDir(tmp_path) as dd:
        keep, drop = dd.vhost_path("keep", create=True), dd.vhost_path("drop", create=True)
        (drop / "msgs.0000000001").write_bytes(b"x" * 10)
        (drop / sha1_name("q")).mkdir()
        dd.remove_vhost("drop")
        assert not drop.exists()
        assert keep.exists()
        assert dd.vhost_dirs() == {"keep": keep}
        dd.remove_vhost("never-existed")  # no error


def test_clean_stop_marker_removal_and_write_are_synced(tmp_path, monkeypatch):
    """A removed marker that reappears after a power loss would make a crash look like a clean stop."""
    import os

    from lavinpy.store import datadir as datadir_module

    d = datadir_module.DataDir(tmp_path)
    d.open()
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    assert d.take_clean_stop_marker() is False
    d.write_clean_stop_marker()
    assert (tmp_path / "clean_shutdown").read_bytes() == b"1\n"
    assert str(tmp_path) in synced and any(p.endswith("clean_shutdown.tmp") or "clean_shutdown" in p
                                           for p in synced)
    synced.clear()
    assert d.take_clean_stop_marker() is True
    assert not (tmp_path / "clean_shutdown").exists()
    assert synced == [str(tmp_path)]  # the directory, after the unlink
    d.close()
