"""Brokers for the attack suite: a lavinpy server of the test's own (a subprocess on a free port)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import LocalBroker


@pytest.fixture
def fresh_broker(tmp_path: Path) -> Iterator[LocalBroker]:
    b = LocalBroker(tmp_path / "broker")
    b.start()
    yield b
    b.close()
