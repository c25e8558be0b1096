"""Fixtures: lavinpy brokers as processes (tests/e2e's LocalBroker) and the shovel engine in process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import LocalBroker

from .engine import EngineThread

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def two_brokers(tmp_path: Path) -> Iterator[tuple[LocalBroker, LocalBroker]]:
    a, b = LocalBroker(tmp_path / "a"), LocalBroker(tmp_path / "b")
    a.start()
    b.start()
    try:
        yield a, b
    finally:
        for x in (a, b):
            if x.running():
                x.stop()


@pytest.fixture
def engine() -> Iterator[EngineThread]:
    e = EngineThread()
    try:
        yield e
    finally:
        e.close()


@pytest.fixture
def one_broker(tmp_path: Path) -> Iterator[LocalBroker]:
    b = LocalBroker(tmp_path / "one")
    b.start()
    try:
        yield b
    finally:
        if b.running():
            b.stop()
