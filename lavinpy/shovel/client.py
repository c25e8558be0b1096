"""The shovel's AMQP 0-9-1 client: one connection with one channel, lavinpy.wire's asyncio client.

A shovel talks to both brokers over the network, as any client does, so it moves messages from
RabbitMQ, LavinMQ or lavinpy alike. Deliveries go to ``on_delivery`` with their raw property block;
confirms go to ``on_confirm``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from lavinpy.wire.client_asyncio import ClientError, ClientProtocol
from lavinpy.wire.client_asyncio import connect as connect_client
from lavinpy.wire.client_connection import ClientConnection
from lavinpy.wire.client_events import ChannelClosed, Confirmed, ConsumerCancelled, Delivery, Event
from lavinpy.wire.uri import AMQPURL

CHANNEL = 1
HEARTBEAT_SECONDS = 30
CONNECT_TIMEOUT = 15.0

DeliveryCallback = Callable[[int, str, str, bytes, bytes], None]  # tag, exchange, routing key, properties, body
ConfirmCallback = Callable[[int, bool, bool], None]  # tag, multiple, nack

# The shovel's errors are the client's: the text says which side and why.
ShovelClientError = ClientError


class ShovelClient(ClientProtocol):
    def __init__(self, connection: ClientConnection) -> None:
        super().__init__(connection)
        self.on_delivery: DeliveryCallback | None = None
        self.on_confirm: ConfirmCallback | None = None
        self.on_writable: Callable[[bool], None] | None = None

    def handle_delivery(self, delivery: Delivery) -> None:
        if self.on_delivery is not None:
            self.on_delivery(delivery.delivery_tag, delivery.exchange, delivery.routing_key, delivery.properties,
                             delivery.body)

    def handle_confirm(self, confirm: Confirmed) -> None:
        if self.on_confirm is not None:
            self.on_confirm(confirm.delivery_tag, confirm.multiple, confirm.nack)

    def handle_event(self, event: Event) -> None:
        if isinstance(event, ConsumerCancelled):
            self.abort("the broker cancelled the consumer (the source queue was deleted?)")
        # connection.blocked: publishes wait in the socket buffer; pause_writing holds the source back

    def writable_changed(self, writable: bool) -> None:
        if self.on_writable is not None:
            self.on_writable(writable)

    def channel_closed(self, closed: ChannelClosed, awaited: bool) -> None:
        # A passive declare's refusal goes to its caller (who may reopen the channel); otherwise the
        # channel messages move on is gone, so the connection goes too and the shovel starts again.
        self.error = self._channel_text(closed)
        if not awaited:
            self.abort()

    async def rpc(self, method: Any, *expect: type, timeout: float = 30.0) -> Any:
        """A synchronous method on the channel and its reply; ShovelClientError when the broker refuses."""
        return (await self.call(CHANNEL, method, *expect, timeout=timeout)).method

    async def reopen_channel(self) -> None:
        """Channel 1 again after the broker closed it (a passive declare that found nothing)."""
        if self.transport is None or self.transport.is_closing():
            raise self.failure()
        self.error = None
        await self.open_channel(CHANNEL)

    def publish(self, exchange: str, routing_key: str, properties: bytes, body: bytes) -> None:
        self.basic_publish(CHANNEL, exchange, routing_key, properties, body)

    def ack(self, tag: int, multiple: bool) -> None:
        self.basic_ack(CHANNEL, tag, multiple)

    def nack(self, tag: int, multiple: bool) -> None:
        self.basic_nack(CHANNEL, tag, multiple, True)

    async def close(self, timeout: float = 3.0, reply_text: str = "shovel stopped") -> None:
        await super().close(timeout, reply_text)


Client = TypeVar("Client", bound=ShovelClient)


async def connect(url: AMQPURL, name: str, *, product: str = "lavinpy shovel",
                  protocol: type[Client] = ShovelClient) -> Client:  # type: ignore[assignment]
    """An open connection with channel 1 open, or ShovelClientError naming the broker and why
    (``protocol``: a ShovelClient subclass, as a federation link's)."""
    tls, tuning = url.tls, url.tuning  # the URI's heartbeat, limits, timeout and mechanisms, as RabbitMQ's links
    connection = ClientConnection(
        url.user, url.password, url.vhost, mechanism=url.mechanism, mechanisms=tuning.mechanisms, name=name,
        product=product, heartbeat=HEARTBEAT_SECONDS if tuning.heartbeat is None else tuning.heartbeat,
        channel_max=tuning.channel_max, frame_max=tuning.frame_max)
    timeout = tuning.connection_timeout or CONNECT_TIMEOUT
    client = await connect_client(connection, url.host, url.port, tls=tls.context() if tls is not None else None,
                                  server_hostname=tls.server_name if tls is not None else None,
                                  timeout=timeout, protocol=protocol)
    try:
        await client.open_channel(CHANNEL, timeout=timeout)
    except ClientError as e:
        client.abort()
        raise ShovelClientError(f"{url.host}:{url.port}: {e}") from None
    return client
