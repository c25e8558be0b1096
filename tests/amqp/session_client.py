"""Drive the AMQP session state machines without sockets: frames built with pamqp go in as bytes,
the bytes that come out are decoded with pamqp, effects are read back as the driver would."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from pamqp import body, commands, frame, header, heartbeat

from lavinpy.amqp.connection import AMQPConnection
from lavinpy.amqp.effects import ConnectionEffect
from lavinpy.amqp.sessions import Sessions
from lavinpy.amqp.spool import BodySpool
from lavinpy.broker.broker import Broker
from lavinpy.config import Config

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
Frame = tuple[int, Any]  # (channel, pamqp frame value)


class Timer:
    def __init__(self, delay: float, callback: Callable[[], None]) -> None:
        self.delay = delay
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualScheduling:
    """The session layer's scheduling by hand: callbacks wait in ``soon`` and ``timers`` until run,
    and tasks (coroutines) in ``tasks``."""

    def __init__(self) -> None:
        self.soon: list[Callable[[], None]] = []
        self.timers: list[Timer] = []
        self.tasks: list[Coroutine[Any, Any, None]] = []

    def start_task(self, work: Coroutine[Any, Any, None]) -> None:
        self.tasks.append(work)

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.soon.append(callback)

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        timer = Timer(delay, callback)
        self.timers.append(timer)
        return timer

    def run_tasks(self) -> None:
        """Run the tasks started so far to their end, in order, on an event loop of their own."""
        tasks, self.tasks = self.tasks, []

        async def run_all() -> None:
            for task in tasks:
                await task
        asyncio.run(run_all())

    def drop_tasks(self) -> None:
        tasks, self.tasks = self.tasks, []
        for task in tasks:
            task.close()

    def fire_timers(self) -> None:
        """Run the timers set so far (not those they set)."""
        timers, self.timers = self.timers, []
        for timer in timers:
            if not timer.cancelled:
                timer.callback()


class Harness:
    """A real broker on a temporary data dir and its session layer; deferred work runs on ``run_soon``."""

    def __init__(self, path: Path, **settings: Any) -> None:
        self.broker = broker = Broker(Config(data_dir=str(path), **settings))
        broker.open()
        self.scheduling = ManualScheduling()
        self.soon = self.scheduling.soon
        broker.scheduler.call_soon = self.scheduling.call_soon  # the model's turns wait in ``soon`` too
        self.sessions = Sessions(broker, self.scheduling, lambda: BodySpool(broker.datadir.path))

    def connect(self, peer: tuple[str, int] = ("127.0.0.1", 50000)) -> Client:
        conn = AMQPConnection(self.sessions, peer)
        conn.start()
        return Client(self, conn)

    def open_client(self, peer: tuple[str, int] = ("127.0.0.1", 50000), *,
                    declare: commands.Queue.Declare | None = None) -> Client:
        """A connection from ``peer`` logged in as guest with channel 1 open; with ``declare``, that
        queue declared on it (its declare-ok read): the start of most benches' and tests' clients."""
        client = self.connect(peer)
        client.handshake()
        client.open_channel(1)
        if declare is not None:
            client.send((1, declare))
            assert client.names() == [(1, "Queue.DeclareOk")]
        return client

    def run_soon(self) -> None:
        """What the event loop would run next: deliveries, then output."""
        while self.soon:
            self.soon.pop(0)()

    def close(self) -> None:
        self.scheduling.drop_tasks()
        self.broker.close()


class Client:
    def __init__(self, harness: Harness, conn: AMQPConnection) -> None:
        self.harness = harness
        self.conn = conn
        self.effects: list[ConnectionEffect] = []

    # --- in ---------------------------------------------------------------------------------------
    def send(self, *frames: Frame | bytes) -> None:
        """Frames (channel, pamqp value) or raw bytes, all in one read."""
        data = b"".join(f if isinstance(f, bytes) else frame.marshal(f[1], f[0]) for f in frames)
        self.conn.receive_data(data)

    def publish(self, channel: int, routing_key: str, payload: bytes, exchange: str = "",
                properties: commands.Basic.Properties | None = None, mandatory: bool = False) -> list[Frame]:
        """basic.publish, its header and body frames (to pass to ``send``)."""
        return [(channel, commands.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=mandatory)),
                (channel, header.ContentHeader(0, len(payload), properties or commands.Basic.Properties())),
                (channel, body.ContentBody(payload))]

    # --- out --------------------------------------------------------------------------------------
    def read(self) -> list[Frame]:
        """Everything the connection has to send, decoded; the effects are kept in ``effects``."""
        self.harness.run_soon()
        data = b"".join(self.conn.data_to_send())
        self.effects += self.conn.take_effects()
        frames: list[Frame] = []
        while data:
            if data.startswith(b"AMQP"):
                frames.append((0, bytes(data[:8])))
                data = data[8:]
                continue
            used, channel, value = frame.unmarshal(data)
            frames.append((channel, value))
            data = data[used:]
        return frames

    def methods(self) -> list[Frame]:
        """Like ``read``, without heartbeats, content headers and bodies."""
        return [(c, f) for c, f in self.read()
                if not isinstance(f, header.ContentHeader | body.ContentBody | heartbeat.Heartbeat | bytes)]

    def names(self) -> list[tuple[int, str]]:
        """Like ``methods``, as (channel, "Class.Method") pairs."""
        return [(c, f.name) for c, f in self.methods()]

    # --- handshake --------------------------------------------------------------------------------
    def handshake(self, user: str = "guest", password: str = "guest", vhost: str = "/", heartbeat: int = 0,
                  capabilities: dict | None = None) -> None:
        self.send(PROTOCOL_HEADER)
        self.read()
        if capabilities is None:
            capabilities = {"connection.blocked": True, "consumer_cancel_notify": True}
        props: dict[str, Any] = {"capabilities": capabilities}
        self.send((0, commands.Connection.StartOk(client_properties=props, mechanism="PLAIN",
                                                  response=f"\0{user}\0{password}", locale="en_US")))
        tune = self.methods()[-1][1]
        assert isinstance(tune, commands.Connection.Tune), tune
        self.send((0, commands.Connection.TuneOk(channel_max=tune.channel_max, frame_max=tune.frame_max,
                                                 heartbeat=heartbeat)),
                  (0, commands.Connection.Open(virtual_host=vhost)))
        assert [type(f) for _, f in self.methods()] == [commands.Connection.OpenOk]

    def open_channel(self, channel: int = 1) -> None:
        self.send((channel, commands.Channel.Open()))
        assert self.names() == [(channel, "Channel.OpenOk")]
