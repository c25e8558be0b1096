"""The model in process, for the test_model_* modules: a Broker on a temporary data dir, no sockets.

Everything goes through the operations both faces call (declare, bind, publish, get with an ack
mode), so these tests hold whichever way the model's insides are arranged. ``run`` gives each test a
running event loop, which the model's TTL and expiry timers need.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from lavinpy.broker.broker import Broker
from lavinpy.broker.ops import messages as operations_messages
from lavinpy.broker.ops import objects as operations_objects
from lavinpy.broker.publishing import REJECTED
from lavinpy.broker.queues.base import QueueKind
from lavinpy.broker.vhost import VHost
from lavinpy.config import Config

OWNER = object()  # the connection declaring the queues (none of them exclusive)


class Model:
    """One broker and its default vhost."""

    def __init__(self, path: Path, **settings: Any) -> None:
        self.path = path
        self.settings = settings
        self.broker = Broker(Config(data_dir=str(path), **settings))
        self.broker.open()

    @property
    def vhost(self) -> VHost:
        return self.broker.vhosts["/"]

    def reopen(self) -> None:
        """Stop cleanly and open the same data dir again (durable queues and messages come back)."""
        self.broker.close()
        self.broker = Broker(Config(data_dir=str(self.path), **self.settings))
        self.broker.open()

    def close(self) -> None:
        self.broker.close()

    # --- objects ------------------------------------------------------------------------------
    def declare(self, name: str, *, durable: bool = False, **arguments: Any) -> QueueKind:
        """A queue; keyword arguments are x-arguments with '_' for '-' (max_length= -> x-max-length)."""
        args = {"x-" + key.replace("_", "-"): value for key, value in arguments.items()}
        return operations_objects.declare_queue(None, self.vhost, name, owner=OWNER, durable=durable,
                                                arguments=args)

    def exchange(self, name: str, type_name: str = "fanout") -> None:
        operations_objects.declare_exchange(None, self.vhost, name, type_name)

    def bind(self, queue: str, exchange: str, routing_key: str = "") -> None:
        operations_objects.bind_queue(None, self.vhost, queue, exchange, routing_key, None, owner=OWNER)

    def dead_letter_target(self, exchange: str = "dlx", queue: str = "dead") -> None:
        """A fanout dead-letter exchange with one queue bound to it."""
        self.exchange(exchange)
        self.declare(queue)
        self.bind(queue, exchange)

    def count(self, queue: str) -> int:
        """Ready messages in ``queue``."""
        return self.vhost.get_queue(queue).message_count

    # --- messages -----------------------------------------------------------------------------
    def publish(self, routing_key: str, body: bytes, exchange: str = "", **properties: Any) -> bool:
        """Publish as a client would (properties in the management API's JSON form); whether any
        queue took it, refused or not."""
        raw = operations_messages.properties_from_json(properties)
        return operations_messages.publish_message(None, self.vhost, exchange, routing_key, raw, body)

    def publish_refused(self, routing_key: str, body: bytes, exchange: str = "", **properties: Any) -> bool:
        """Publish; whether a reject-publish queue refused it (its confirm would be a basic.nack)."""
        raw = operations_messages.properties_from_json(properties)
        _, outcome = self.vhost.publish(self.vhost.get_exchange(exchange), routing_key, raw, body)
        return outcome is REJECTED

    def get(self, queue: str, count: int = 1, ackmode: str = "ack_requeue_false") -> list[dict[str, Any]]:
        """basic.get up to ``count`` times, settled as ``ackmode`` says (ack_requeue_false,
        reject_requeue_false, reject_requeue_true, ack_requeue_true)."""
        return operations_messages.get_messages(None, self.vhost, queue, count=count, ackmode=ackmode)

    def bodies(self, queue: str, count: int = 1000) -> list[str]:
        """Take (and ack) every ready message: their bodies, in order."""
        return [m["payload"] for m in self.get(queue, count)]


def run(test: Callable[[Model], Coroutine[Any, Any, None]], path: Path, **settings: Any) -> None:
    """Run ``test(model)`` on a running event loop, then close the broker."""
    async def body() -> None:
        model = Model(path, **settings)
        try:
            await test(model)
        finally:
            model.close()
    asyncio.run(body())


async def until(check: Callable[[], Any], timeout: float = 5.0, what: str = "condition") -> Any:
    """Let the event loop run (timers fire) until ``check()`` is true; AssertionError after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.01)


def death(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A got message's x-death entries (oldest last, as RabbitMQ keeps them)."""
    return message["properties"].get("headers", {}).get("x-death", [])
