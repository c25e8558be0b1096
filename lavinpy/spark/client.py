"""The Spark tasks' AMQP 0-9-1 connection: lavinpy.wire's blocking client, named as the data source."""

from __future__ import annotations

from lavinpy.wire.client_blocking import (
    DEFAULT_PORT,
    AMQPClientError,
    AMQPParams,
    BlockingConnection,
    BrokerClosed,
    ConnectionLost,
    Frame,
)

__all__ = ["DEFAULT_PORT", "AMQPClientError", "AMQPParams", "BrokerClosed", "Connection", "ConnectionLost", "Frame"]


class Connection(BlockingConnection):
    """One blocking connection of a Spark task (or the driver's probe)."""

    def __init__(self, params: AMQPParams) -> None:
        super().__init__(params, product="lavinpy.spark")
