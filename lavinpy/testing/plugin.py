"""The pytest plugin, loaded through the package's ``pytest11`` entry point: no configuration needed.

Fixtures:
  lavinpy_broker  a Broker for the whole session (each xdist worker gets its own).
  lavinpy_vhost   a fresh vhost per test (a VirtualHost: its AMQP URL, with mqtt_username, http_url,
                  user, password and the queue helpers), deleted after the test.

pytest imports this module at start-up in every project where lavinpy is installed: it imports pytest
only, and the broker's module when a fixture is first used.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .broker import Broker, VirtualHost


@pytest.fixture(scope="session")
def lavinpy_broker() -> Iterator[Broker]:
    """A lavinpy broker for the session: free ports (AMQP, MQTT, HTTP), a temporary data dir."""
    from .broker import Broker

    with Broker() as broker:
        yield broker


@pytest.fixture
def lavinpy_vhost(lavinpy_broker: Broker) -> Iterator[VirtualHost]:
    """A new vhost on the session's broker, with every permission for its user; deleted after the test."""
    vhost = lavinpy_broker.vhost()
    try:
        yield vhost
    finally:
        if lavinpy_broker.running():
            vhost.delete()
