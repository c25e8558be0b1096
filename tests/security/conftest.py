"""The attack suite's brokers: real lavinpy processes started as the end-to-end tests start them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import LocalBroker


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    """One broker for a test module (tests use unique names)."""
    b = LocalBroker(tmp_path_factory.mktemp("security"))
    b.start()
    yield b
    b.close()


@pytest.fixture
def fresh_broker(tmp_path: Path) -> Iterator[LocalBroker]:
    """A broker of this test's own."""
    b = LocalBroker(tmp_path / "broker")
    b.start()
    yield b
    b.close()
