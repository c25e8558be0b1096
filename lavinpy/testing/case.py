"""unittest: a broker per test class, a fresh vhost per test."""

from __future__ import annotations

import unittest
from typing import Any, ClassVar

from .broker import Broker, VirtualHost


class BrokerTestCase(unittest.TestCase):
    """A TestCase whose class starts a broker (``cls.broker``) and whose every test gets a new vhost
    (``self.vhost``, its AMQP URL; deleted after the test).

    broker_options: keyword arguments for Broker (e.g. ``{"mqtt": False}``).
    """

    broker: ClassVar[Broker]
    broker_options: ClassVar[dict[str, Any]] = {}
    vhost: VirtualHost

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.broker = Broker(**cls.broker_options).start()
        cls.addClassCleanup(cls.broker.stop)

    def setUp(self) -> None:
        super().setUp()
        self.vhost = self.broker.vhost()
        self.addCleanup(self.vhost.delete)
