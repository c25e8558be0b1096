"""The workload, run in the client namespace as its own process: ``python3 workload.py CONFIG.json``.

It records a history (JSON lines, ``t`` = time.monotonic(), the same clock as the test's fault log):

- publishers (aio-pika, publisher confirms, persistent messages, mandatory, each id published once):
  ``invoke`` / ``ok`` (confirmed) / ``fail`` (nacked or returned) / ``info`` (no outcome: the connection
  broke or the confirm timed out). Publisher A connects directly to the node the probe says serves,
  so that a confirm can be attributed to a node; the others go round-robin over the nodes (through
  followers' proxies too). After an error they reconnect to the next node with a backoff.
- a consumer (manual ack, prefetch): ``deliver`` with the redelivered flag, recorded before the ack.
- durable queue declares at an interval: ``dinvoke`` / ``dok`` / ``dfail``.
- a serving probe: every 100 ms an HTTP request to each node's Prometheus port, which only a leader's
  own broker opens: ``probe`` on every change (``last`` = the last answer before a node went quiet).

A control file (JSON, re-read every 0.1 s) pauses and resumes publishing, consuming and declaring,
can cap the number of messages published (``budget``) and change the rate and the body padding. A
status file tells the test the counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import aio_pika
import aio_pika.abc

DEFAULT_CONTROL = {"publish": True, "consume": True, "declare": True, "budget": None, "rate": None, "pad": None}


class Workload:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.nodes: list[dict[str, str]] = config["nodes"]
        self.queue: str = config["queue"]
        self.history = open(config["history"], "a", buffering=1 << 16)  # noqa: SIM115 - closed in run()
        self.control_path = Path(config["control"])
        self.status_path = Path(config["status"])
        self.control = dict(DEFAULT_CONTROL)
        self.serving: dict[str, bool] = {n["name"]: False for n in self.nodes}
        self.counts = {"invoke": 0, "ok": 0, "fail": 0, "info": 0, "deliver": 0, "dok": 0}
        self.last = {"ok": 0.0, "deliver": 0.0}
        self.stop = asyncio.Event()
        self._connections = 0

    # ---- history --------------------------------------------------------------------------------

    def record(self, kind: str, **fields: Any) -> None:
        now = time.monotonic()
        self.history.write(json.dumps({"t": round(now, 4), "k": kind, **fields}) + "\n")
        if kind in self.counts:
            self.counts[kind] += 1
        if kind in self.last:
            self.last[kind] = now

    async def housekeeping(self) -> None:
        """Read the control file, write the status file, flush the history."""
        while not self.stop.is_set():
            try:
                control = {**DEFAULT_CONTROL, **json.loads(self.control_path.read_text())}
            except (OSError, ValueError):
                control = self.control
            if control != self.control:
                self.record("ctl", **control)
                self.control = control
            status = {**self.counts, "last_ok": self.last["ok"], "last_deliver": self.last["deliver"],
                      "serving": [n for n, up in self.serving.items() if up], "t": time.monotonic()}
            tmp = self.status_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(status))
            tmp.replace(self.status_path)
            self.history.flush()
            await asyncio.sleep(0.1)

    # ---- connections ----------------------------------------------------------------------------

    async def connect(self, node: dict[str, str], role: str
                      ) -> tuple[aio_pika.abc.AbstractConnection, int, asyncio.Event]:
        """A connection, its number, and an event set when it is lost (aio-pika's ``is_closed`` only
        turns true on an explicit close)."""
        self._connections += 1
        number = self._connections
        connection = await asyncio.wait_for(aio_pika.connect(
            host=node["ip"], port=self.config["amqp_port"], login=self.config["user"],
            password=self.config["password"], timeout=3, heartbeat=self.config["heartbeat"],
            client_properties={"connection_name": f"{role}-{number}"}), 5)
        lost = asyncio.Event()
        connection.close_callbacks.add(lambda *_: lost.set())
        return connection, number, lost

    async def backoff(self, failures: int) -> None:
        await asyncio.sleep(min(1.0, 0.2 * (1 + failures)))

    async def paused(self, what: str) -> bool:
        """Wait while ``what`` is paused; False once the workload stops."""
        while not self.control.get(what, True) and not self.stop.is_set():
            await asyncio.sleep(0.05)
        return not self.stop.is_set()

    # ---- publishers -----------------------------------------------------------------------------

    def _target(self, name: str, turn: int) -> tuple[dict[str, str], bool]:
        if name == "A":
            serving = [n for n in self.nodes if self.serving[n["name"]]]
            if len(serving) == 1:
                return serving[0], True
        return self.nodes[turn % len(self.nodes)], False

    def _budget_left(self) -> bool:
        budget = self.control.get("budget")
        return budget is None or self.counts["invoke"] < budget

    async def publisher(self, name: str) -> None:
        config = self.config
        seq = turn = failures = 0
        while await self.paused("publish"):
            node, direct = self._target(name, turn)
            turn += 1
            try:
                connection, number, lost = await self.connect(node, f"pub{name}")
                channel = await asyncio.wait_for(connection.channel(publisher_confirms=True), 5)
                await asyncio.wait_for(channel.declare_queue(self.queue, durable=True), 5)
            except Exception as e:  # noqa: BLE001 - any failure means: try the next node
                self.record("conn-fail", p=name, n=node["name"], e=repr(e)[:200])
                failures += 1
                await self.backoff(failures)
                continue
            self.record("conn", p=name, n=node["name"], c=number, direct=direct)
            broken = asyncio.Event()
            window = asyncio.Semaphore(config["inflight"])
            tasks: set[asyncio.Task[None]] = set()
            next_at = time.monotonic()
            while not broken.is_set() and not lost.is_set() and self.control["publish"] \
                    and not self.stop.is_set():
                if not self._budget_left():
                    await asyncio.sleep(0.05)
                    continue
                next_at = max(next_at + 1.0 / (self.control["rate"] or config["rate"]), time.monotonic() - 1.0)
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                await window.acquire()
                if broken.is_set() or lost.is_set():
                    window.release()
                    break
                if not self._budget_left():  # checked again: the other publishers ran meanwhile
                    window.release()
                    continue
                seq += 1
                ident = f"{name}-{seq}"
                self.record("invoke", p=name, id=ident, n=node["name"], c=number)
                pad = self.control["pad"]
                body = json.dumps({"id": ident}).encode() + b" " * (config["pad"] if pad is None else pad)
                task = asyncio.ensure_future(self._publish_one(channel, ident, body, node["name"], number, broken))
                tasks.add(task)
                task.add_done_callback(lambda t, ts=tasks, w=window: (ts.discard(t), w.release()))
            if tasks:
                await asyncio.wait(tasks, timeout=config["confirm_timeout"] + 1)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.close(), 2)
            self.record("closed", p=name, n=node["name"], c=number)
            failures = failures + 1 if broken.is_set() or lost.is_set() else 0
            if failures:
                await self.backoff(failures)

    async def _publish_one(self, channel: aio_pika.abc.AbstractChannel, ident: str, body: bytes, node: str,
                           number: int, broken: asyncio.Event) -> None:
        message = aio_pika.Message(body, message_id=ident, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
        try:
            await channel.default_exchange.publish(message, routing_key=self.queue, mandatory=True,
                                                   timeout=self.config["confirm_timeout"])
        except aio_pika.exceptions.DeliveryError as e:
            self.record("fail", id=ident, n=node, c=number, e=repr(e)[:200])
        except Exception as e:  # noqa: BLE001 - no outcome: it may or may not have been stored
            self.record("info", id=ident, n=node, c=number, e=repr(e)[:200])
            broken.set()
        else:
            self.record("ok", id=ident, n=node, c=number)

    # ---- consumer -------------------------------------------------------------------------------

    async def consumer(self) -> None:
        turn = failures = 0
        while await self.paused("consume"):
            node = self.nodes[turn % len(self.nodes)]
            turn += 1
            try:
                connection, number, lost = await self.connect(node, "consumer")
                channel = await asyncio.wait_for(connection.channel(), 5)
                await asyncio.wait_for(channel.set_qos(prefetch_count=self.config["prefetch"]), 5)
                queue = await asyncio.wait_for(channel.declare_queue(self.queue, durable=True), 5)

                async def deliver(message: aio_pika.abc.AbstractIncomingMessage, n: str = node["name"],
                                  c: int = number) -> None:
                    ident = message.message_id or json.loads(message.body.split(b"}")[0] + b"}")["id"]
                    self.record("deliver", id=ident, r=bool(message.redelivered), n=n, c=c)
                    await message.ack()
                await asyncio.wait_for(queue.consume(deliver), 5)
            except Exception as e:  # noqa: BLE001
                self.record("conn-fail", p="consumer", n=node["name"], e=repr(e)[:200])
                failures += 1
                await self.backoff(failures)
                continue
            self.record("conn", p="consumer", n=node["name"], c=number, direct=False)
            failures = 0
            while not lost.is_set() and self.control["consume"] and not self.stop.is_set():
                await asyncio.sleep(0.1)
            broken = lost.is_set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.close(), 2)
            self.record("closed", p="consumer", n=node["name"], c=number)
            if broken:
                await self.backoff(1)

    # ---- declares -------------------------------------------------------------------------------

    async def declarer(self) -> None:
        turn = 0
        while await self.paused("declare"):
            await asyncio.sleep(self.config["declare_interval"])
            if not self.control["declare"] or self.stop.is_set():
                continue
            node = self.nodes[turn % len(self.nodes)]
            name = f"{self.config['declare_prefix']}-{turn}"
            turn += 1
            self.record("dinvoke", q=name, n=node["name"])
            try:
                connection, _, _ = await self.connect(node, "declare")
            except Exception as e:  # noqa: BLE001
                self.record("dfail", q=name, n=node["name"], e=repr(e)[:200])
                continue
            try:
                channel = await asyncio.wait_for(connection.channel(), 5)
                await asyncio.wait_for(channel.declare_queue(name, durable=True), 5)
                self.record("dok", q=name, n=node["name"])
            except Exception as e:  # noqa: BLE001
                self.record("dfail", q=name, n=node["name"], e=repr(e)[:200])
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(connection.close(), 2)

    # ---- serving probe --------------------------------------------------------------------------

    async def probe(self) -> None:
        last_up = {n["name"]: 0.0 for n in self.nodes}
        while not self.stop.is_set():
            started = time.monotonic()
            results = await asyncio.gather(*(self._answers(n["ip"]) for n in self.nodes))
            for node, up in zip(self.nodes, results, strict=True):
                name = node["name"]
                if up != self.serving[name]:
                    self.record("probe", n=name, up=up, last=round(last_up[name], 4))
                    self.serving[name] = up
                if up:
                    last_up[name] = started
            await asyncio.sleep(max(0.0, self.config["probe_interval"] - (time.monotonic() - started)))

    async def _answers(self, ip: str) -> bool:
        """An HTTP answer from the Prometheus port within the probe's timeout."""
        writer = None
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(ip, self.config["prom_port"]), 0.3)
            writer.write(b"GET /jepsen-probe HTTP/1.0\r\n\r\n")
            line = await asyncio.wait_for(reader.readline(), 0.3)
            return line.startswith(b"HTTP/")
        except (OSError, TimeoutError):
            return False
        finally:
            if writer is not None:
                writer.close()

    # ---- main -----------------------------------------------------------------------------------

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.stop.set)
        self.record("start", pid=os.getpid())
        tasks = [asyncio.ensure_future(self.housekeeping()), asyncio.ensure_future(self.probe())]
        await asyncio.sleep(0.3)  # a first round of probes: publisher A starts knowing the leader
        tasks += [asyncio.ensure_future(self.publisher(chr(ord("A") + i))) for i in range(self.config["publishers"])]
        tasks += [asyncio.ensure_future(self.consumer()), asyncio.ensure_future(self.declarer())]
        await self.stop.wait()
        await asyncio.wait(tasks, timeout=self.config["confirm_timeout"] + 3)
        for task in tasks:
            task.cancel()
        self.record("stop")
        self.history.close()


def main() -> None:
    config = json.loads(Path(sys.argv[1]).read_text())
    for name in ("aio_pika", "aiormq"):  # every failed connect is expected here; the history has them
        logging.getLogger(name).setLevel(logging.CRITICAL)
    asyncio.run(Workload(config).run())
    os._exit(0)  # connections still closing are of no interest any more


if __name__ == "__main__":
    main()
