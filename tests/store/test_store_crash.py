"""Crash test: a child process publishes, consumes and flushes; the parent SIGKILLs it at random.

The child reports a message id ("P <id>") or an ack ("A <queue> <id>") on stdout only after the
flush covering it resolved; it announces an ack ("M <queue> <id>") just before making it. After
each kill the parent reopens the store and checks that every reported message is in each queue it
was routed to (unless an ack removed it), that every entry of every queue reads back intact (no
CorruptRecord, no MissingRecord, body equal), and that no reported ack has come back. 10 kills in CI (two of
them during start-up and recovery, the others at random), 22 with LAVINPY_LONG=1.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from lavinpy.store.vhost_store import VhostStore
from tests.helpers import LONG

SEGMENT_SIZE = 64 * 1024
QUEUES = ("q0", "q1", "q2")
ROUNDS = 22 if LONG else 10
# Rounds whose kill comes during the child's start-up and recovery, whatever the random draw says.
EARLY_KILL_ROUNDS = (3, 7)

# Shared by the parent and the child: which queues a message goes to, and its exact body.
COMMON = r'''
import random

QUEUES = ("q0", "q1", "q2")


def routed_to(msg_id):
    rng = random.Random(msg_id)
    return sorted(rng.sample(QUEUES, rng.randint(1, 3)))


def body_of(msg_id):
    rng = random.Random(msg_id * 7919 + 1)
    r = rng.random()
    size = rng.randint(0, 64) if r < 0.5 else rng.randint(0, 4000) if r < 0.97 else rng.randint(60_000, 150_000)
    return msg_id.to_bytes(8, "little") + rng.randbytes(size)
'''

CHILD = COMMON + r'''
import asyncio
import sys
from pathlib import Path

from lavinpy.store.vhost_store import VhostStore


async def main(path, next_id, seed):
    rng = random.Random(seed)
    store = VhostStore(Path(path), segment_size=64 * 1024, fsync="always", ack_file_max_bytes=64 * 8)
    store.open()
    queues = {name: store.open_queue(name, durable=True) for name in QUEUES}
    store.finish_recovery()
    print("READY", flush=True)
    counter = [next_id]

    async def publisher():
        while True:
            lines = []
            for _ in range(rng.randint(1, 20)):
                msg_id = counter[0]
                counter[0] += 1
                pos = store.messages.append("ex", "rk", b"\x00\x00", body_of(msg_id))
                for name in routed_to(msg_id):
                    queues[name].push(pos)
                lines.append(f"P {msg_id}\n")
            if rng.random() < 0.5:
                name = rng.choice(QUEUES)
                q = queues[name]
                for _ in range(rng.randint(1, 30)):
                    pos = q.shift()
                    if pos is None:
                        break
                    msg_id = int.from_bytes(store.messages.read(pos).body[:8], "little")
                    if rng.random() < 0.8:
                        # announced before it happens: the parent then knows it may be gone
                        sys.stdout.write(f"M {name} {msg_id}\n")
                        sys.stdout.flush()
                        q.ack(pos)
                        lines.append(f"A {name} {msg_id}\n")
                    elif rng.random() < 0.5:
                        q.requeue(pos)
            await store.flush()
            sys.stdout.write("".join(lines))
            sys.stdout.flush()

    await asyncio.gather(*(publisher() for _ in range(3)))


asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
'''

namespace: dict = {}
exec(COMMON, namespace)
routed_to = namespace["routed_to"]
body_of = namespace["body_of"]


def run_child(path: Path, next_id: int, seed: int, rng: random.Random, early: bool = False) -> list[str]:
    """Start the child, SIGKILL it at a random moment (during its start-up if ``early``), return its complete
    report lines."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(next_id), str(seed)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines: list[str] = []
    ready = threading.Event()

    def reader() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            if not raw.endswith(b"\n"):
                break  # a line cut by the kill was never fully reported
            line = raw.decode()
            if line == "READY\n":
                ready.set()
            else:
                lines.append(line)

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    if rng.random() < 0.15 or early:
        time.sleep(rng.uniform(0.05, 0.4))  # sometimes kill during start-up and recovery
    else:
        assert ready.wait(20), proc.stderr.read().decode() if proc.poll() is not None else "child not ready"
        time.sleep(rng.uniform(0.05, 0.7))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    thread.join(10)
    stderr = proc.stderr.read().decode()
    assert proc.returncode == -signal.SIGKILL, stderr
    assert "Traceback" not in stderr, stderr
    return lines


def verify(path: Path, expected: dict[str, set[int]], acked: dict[str, set[int]],
           maybe_acked: dict[str, set[int]], clean: bool) -> int:
    """Reopen the store and check it; returns the highest message id found on disk.

    A message whose ack was under way when the child died may or may not be there; what the disk
    says then becomes the expectation for the next rounds.
    """
    store = VhostStore(path, segment_size=SEGMENT_SIZE)
    store.open()
    assert set(store.queue_names_on_disk()) <= set(QUEUES)
    highest = -1
    for name in QUEUES:
        index = store.open_queue(name, durable=True)
        present = []
        for pos in index:
            body = store.messages.read(pos).body  # raises on a damaged or missing record
            msg_id = int.from_bytes(body[:8], "little")
            assert body == body_of(msg_id), f"{name}: message {msg_id} is damaged"
            assert name in routed_to(msg_id), f"{name}: message {msg_id} was never routed here"
            present.append(msg_id)
        assert len(present) == len(set(present)), f"{name}: duplicate entries"
        assert present == sorted(present), f"{name}: not in publish order"
        missing = expected[name] - set(present) - maybe_acked[name]
        assert not missing, f"{name}: reported messages lost: {sorted(missing)[:10]}"
        assert not acked[name] & set(present), f"{name}: reported acks came back"
        gone = maybe_acked[name] - set(present)
        expected[name] -= gone
        acked[name] |= gone
        maybe_acked[name].clear()
        highest = max([highest, *present])
    store.finish_recovery()
    store.close(clean=clean)
    return highest


def test_sigkill_never_loses_flushed_messages(tmp_path: Path) -> None:
    rng = random.Random(int.from_bytes(os.urandom(4), "little"))
    seed = rng.randrange(1 << 30)
    path = tmp_path / "vhost"
    expected = {name: set() for name in QUEUES}  # reported published, not reported acked
    acked = {name: set() for name in QUEUES}
    maybe_acked = {name: set() for name in QUEUES}  # ack started, its flush not reported
    next_id = 0
    reported = 0
    for round_no in range(ROUNDS):
        lines = run_child(path, next_id, seed + round_no, rng, early=round_no in EARLY_KILL_ROUNDS)
        for line in lines:
            parts = line.split()
            if parts[0] == "P":
                msg_id = int(parts[1])
                for name in routed_to(msg_id):
                    expected[name].add(msg_id)
                next_id = max(next_id, msg_id + 1)
                reported += 1
            elif parts[0] == "M":
                maybe_acked[parts[1]].add(int(parts[2]))
            else:
                name, msg_id = parts[1], int(parts[2])
                expected[name].discard(msg_id)
                maybe_acked[name].discard(msg_id)
                acked[name].add(msg_id)
        highest = verify(path, expected, acked, maybe_acked, clean=rng.random() < 0.5)
        # ids published but not reported may be on disk: never reuse them
        next_id = max(next_id, highest + 1) + 1000
    assert reported > 200, f"the children reported only {reported} messages (seed {seed})"
