"""A real lavinpy broker for any test suite: a subprocess on free ports with a temporary data dir.

    with lavinpy.testing.Broker() as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))

The pytest fixtures (``lavinpy_broker``, ``lavinpy_vhost``) come from lavinpy.testing.plugin, which
pytest loads through the package's entry point; unittest suites use BrokerTestCase. See docs/testing.md.

The names are loaded on first use: pytest imports this package at start-up for every project that has
lavinpy installed, and a project that never asks for a broker should not pay for subprocess, ctypes or
urllib.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .broker import APIError, Broker, BrokerError, Message, VirtualHost
    from .case import BrokerTestCase

__all__ = ["APIError", "Broker", "BrokerError", "BrokerTestCase", "Message", "VirtualHost"]

_WHERE = {"APIError": "broker", "Broker": "broker", "BrokerError": "broker", "Message": "broker",
          "VirtualHost": "broker", "BrokerTestCase": "case"}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"{__name__}.{module}"), name)
