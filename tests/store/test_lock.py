import os
import subprocess
import sys
import textwrap

import pytest

from lavinpy.store.lock import DataDirLock, DataDirLocked

# A second process that tries to take the lock and reports what happened.
CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from lavinpy.store.lock import DataDirLock, DataDirLocked
    lock = DataDirLock(Path(sys.argv[1]))
    try:
        lock.acquire()
    except DataDirLocked as exc:
        print("LOCKED", exc)
        sys.exit(3)
    print("ACQUIRED", Path(sys.argv[1]).read_text().strip())
    lock.release()
    """
)


def run_child(lock_path):
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(lock_path)], capture_output=True, text=True, timeout=30
    )


def test_second_process_is_refused_with_clear_message_then_succeeds(tmp_path):
    lock_path = tmp_path / ".lock"
    lock = DataDirLock(lock_path)
    lock.acquire()
    try:
        assert lock_path.read_text().strip() == str(os.getpid())
        refused = run_child(lock_path)
        assert refused.returncode == 3, refused.stderr
        assert refused.stdout.strip() == (
            f"LOCKED data directory {tmp_path} is in use by another lavinpy process (pid {os.getpid()})"
        )
    finally:
        lock.release()
    accepted = run_child(lock_path)
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    child_pid = int(accepted.stdout.split()[1])
    assert child_pid != os.getpid()


def test_lock_is_freed_when_holder_dies(tmp_path):
    lock_path = tmp_path / ".lock"
    hold_until_killed = CHILD.replace("lock.release()", "sys.stdout.flush(); input()")
    holder = subprocess.Popen(
        [sys.executable, "-c", hold_until_killed, str(lock_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().startswith("ACQUIRED")
        with pytest.raises(DataDirLocked, match=f"pid {holder.pid}"):
            DataDirLock(lock_path).acquire()
    finally:
        holder.kill()
        holder.wait()
    with DataDirLock(lock_path) as lock:
        assert lock.held


def test_second_lock_in_same_process_is_refused(tmp_path):
    first, second = DataDirLock(tmp_path / ".lock"), DataDirLock(tmp_path / ".lock")
    first.acquire()
    with pytest.raises(DataDirLocked, match="in use by another lavinpy process"):
        second.acquire()
    assert not second.held
    first.release()
    second.acquire()
    assert second.held
    second.release()
    assert (tmp_path / ".lock").read_text() == ""  # pid cleared on release


def test_release_and_acquire_are_idempotent(tmp_path):
    lock = DataDirLock(tmp_path / ".lock")
    lock.release()
    lock.acquire()
    lock.acquire()
    assert lock.held
    lock.release()
    lock.release()
    assert not lock.held
