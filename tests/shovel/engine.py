"""The shovel engine run in the test process, on its own event loop thread, as the server runs it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from lavinpy.shovel.component import LocalNode, ShovelComponent, Shovels


class EngineThread:
    def __init__(self, local_port: int = 5672) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        # In process there is no broker to take the internal login: local shovels log in as guest.
        local = LocalNode("127.0.0.1", local_port, lambda _user: "guest", mechanism="PLAIN")
        self.shovels: Shovels = self.call(lambda: Shovels(local, "test"))
        self.component = ShovelComponent(self.shovels, lambda _vhost, _name: "guest")
        self.finished: list[tuple[str, str]] = []
        self.shovels.on_finished = lambda vhost, name: self.finished.append((vhost, name))
        self.call(self.shovels.start)

    def call(self, fn: Callable[[], Any]) -> Any:
        async def run() -> Any:
            return fn()
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def apply(self, name: str, value: dict, vhost: str = "/") -> None:
        self.component.validate(vhost, name, value)
        self.call(lambda: self.component.apply(vhost, name, value))

    def remove(self, name: str, vhost: str = "/") -> None:
        self.call(lambda: self.component.remove(vhost, name))

    def status(self, name: str, vhost: str = "/") -> dict:
        rows = self.call(lambda: self.shovels.status(vhost))
        return next(r for r in rows if r["name"] == name)

    def wait_state(self, name: str, state: str, timeout: float = 15.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            row = self.status(name)
            if row["state"] == state:
                return row
            if time.monotonic() > deadline:
                raise AssertionError(f"shovel {name} not {state} within {timeout} s: {row}")
            time.sleep(0.05)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.shovels.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
