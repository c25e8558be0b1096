"""Does the consumers' output hold engage? 1,000 consumers on one queue over sockets, at fixed publish rates.

For each ``--rates`` entry (msg/s, 0 = as fast as amqpperf goes) a lavinpy broker (the tree on PYTHONPATH,
fsync always, as bench/scale.py starts it) takes amqpperf's load (1 publisher, 16 B, ``--consumers`` at
``--prefetch``); the broker counts, in its own process, how often a consuming connection's turn held its
output (``ConnectionOutput.run_pending``) and how many writes the consuming connections made. Printed per
run: the broker's CPU per consumed message, the held share of those turns, messages per consumer write, and
per consumed message the consumers' reads (their acks), the scheduler's turns, the output looks (run_pending)
and the hold's room checks (``consumers_have_room``) among them.
The hold engages only while a publisher's reader thread has input left after a take
(``sessions.input_waiting``): when the broker keeps up with the publisher it seldom does.

    PYTHONPATH=<tree> python3 bench/consumer_hold_bench.py --amqpperf <amqpperf> [--rates 30000,0
                                                           --prefetch 100 --consumers 1000 --repeat 1]
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def broker_child(counts_file: str, argv: list[str]) -> None:
    """Run the broker with run_pending and the consumers' writes counted (dumped twice a second)."""
    # (connection's import registers the compiled room check, counted below)
    from lavinpy.amqp import connection, output, transport
    from lavinpy.broker import scheduler

    counts = {"held": 0, "written": 0, "writes": 0, "reads": 0, "turns": 0, "rooms": 0}
    run_pending, data_to_send = output.ConnectionOutput.run_pending, output.ConnectionOutput.data_to_send

    def counted_run_pending(self: output.ConnectionOutput) -> None:
        before = self._output_held
        run_pending(self)
        counts["held" if self._output_held > before else "written"] += 1

    def counted_data_to_send(self: output.ConnectionOutput) -> list:
        out = data_to_send(self)
        if out and self in self.sessions.consuming:
            counts["writes"] += 1
        return out

    data_received, turn = transport.AMQPProtocol.data_received, scheduler.DeliveryScheduler.run

    def counted_data_received(self: transport.AMQPProtocol, data: bytes) -> None:
        if self.conn is not None and self.conn in self.conn.sessions.consuming:
            counts["reads"] += 1  # (a consumer's reads: its acks)
        data_received(self, data)

    def counted_turn(self: scheduler.DeliveryScheduler) -> None:
        counts["turns"] += 1
        turn(self)

    transport.AMQPProtocol.data_received = counted_data_received  # type: ignore[method-assign]
    scheduler.DeliveryScheduler.run = counted_turn  # type: ignore[method-assign]
    output.ConnectionOutput.run_pending = counted_run_pending  # type: ignore[method-assign]
    output.ConnectionOutput.data_to_send = counted_data_to_send  # type: ignore[method-assign]

    # The hold's room checks (consumers_have_room, compiled or not, as the tree has it)
    if hasattr(output, "_have_room"):
        have_room = output._have_room

        def counted_room(conn: output.ConnectionOutput) -> bool:
            counts["rooms"] += 1
            return have_room(conn)

        output._have_room = counted_room
    else:
        room = connection.AMQPConnection.consumers_have_room

        def counted_method(self: connection.AMQPConnection) -> bool:
            counts["rooms"] += 1
            return room(self)

        connection.AMQPConnection.consumers_have_room = counted_method  # type: ignore[method-assign]

    def dump() -> None:
        while True:
            time.sleep(0.5)
            Path(counts_file).write_text(json.dumps(counts))

    threading.Thread(target=dump, daemon=True).start()
    sys.argv = ["lavinpy", *argv]
    runpy.run_module("lavinpy", run_name="__main__")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_once(args: argparse.Namespace, rate: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        port, counts_file = free_port(), os.path.join(tmp, "counts.json")
        broker = subprocess.Popen(
            [sys.executable, __file__, "--broker-child", counts_file, "--data-dir", os.path.join(tmp, "data"),
             "--amqp-port", str(port), "--http-port", "0", "--prometheus-port", "0", "--mqtt-port", "0",
             "--bind", "127.0.0.1", "--log-level", "warning", "--fsync", "always"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(100):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.1)
            load = [args.amqpperf, "-uri", f"amqp://guest:guest@127.0.0.1:{port}/", "-broker-pid", str(broker.pid),
                    "-consumers", str(args.consumers), "-queues", "1", "-publishers", "1", "-size", "16",
                    "-prefetch", str(args.prefetch), "-warmup", str(args.warmup), "-duration", str(args.duration)]
            if rate:
                load += ["-rate", str(rate)]
            r = json.loads(subprocess.run(load, capture_output=True, text=True, check=True).stdout)
            time.sleep(0.6)  # the last dump
            counts = json.loads(Path(counts_file).read_text())
        finally:
            broker.terminate()
            broker.wait()
    cores = (r.get("cpu_cores") or {}).get("broker") or 0
    consumed = r.get("con_rate") or 0
    turns = counts["held"] + counts["written"]
    # (counts cover the whole run, warm-up included; the rate is the measured window's)
    seconds = args.warmup + args.duration
    return {"rate": rate, "con msg/s": consumed, "broker cores": cores,
            "us/msg": cores * 1e6 / consumed if consumed else 0,
            "held share": counts["held"] / turns if turns else 0,
            "msg/write": consumed * seconds / counts["writes"] if counts["writes"] else 0,
            # per consumed message (the counts' whole run against the measured rate over it)
            "reads/msg": counts["reads"] / (consumed * seconds) if consumed else 0,
            "turns/msg": counts["turns"] / (consumed * seconds) if consumed else 0,
            "looks/msg": turns / (consumed * seconds) if consumed else 0,
            "rooms/msg": counts.get("rooms", 0) / (consumed * seconds) if consumed else 0}


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--broker-child":
        broker_child(sys.argv[2], sys.argv[3:])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--amqpperf", required=True)
    ap.add_argument("--rates", default="30000,0", help="publish rates, msg/s (0: as fast as it goes)")
    ap.add_argument("--consumers", type=int, default=1000)
    ap.add_argument("--prefetch", type=int, default=100)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    for _ in range(args.repeat):
        for rate in (float(x) for x in args.rates.split(",")):
            f = run_once(args, rate)
            print(f"rate {f['rate']:>8,.0f}  consumed {f['con msg/s']:>9,.0f}/s  broker {f['broker cores']:.2f} cores "
                  f"{f['us/msg']:6.2f} us/msg  held share {f['held share']:.2f}  {f['msg/write']:5.1f} msg/write  "
                  f"per msg: {f['reads/msg']:.3f} ack reads, {f['turns/msg']:.3f} turns, "
                  f"{f['looks/msg']:.3f} output looks, {f['rooms/msg']:.3f} room checks",
                  flush=True)


if __name__ == "__main__":
    main()
