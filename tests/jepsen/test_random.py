"""Seeded random fault schedules (schedule.py): about a minute of faults in CI mode, 30 minutes with
three etcd members and the nightly faults in long mode (LAVINPY_JEPSEN=long). The seed is printed with
any failure; LAVINPY_JEPSEN_SEED=<seed> replays the same choices."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from .runner import Run, Settings
from .schedule import CI_FAULTS, LONG_FAULTS, random_schedule

pytestmark = pytest.mark.jepsen


@pytest.mark.timeout(3 * 3600)
def test_random_fault_schedule(jepsen: Callable[..., Any], jepsen_settings: Settings) -> None:
    faults = LONG_FAULTS if jepsen_settings.long else CI_FAULTS

    def body(run: Run) -> None:
        random_schedule(run, jepsen_settings.seed, jepsen_settings.minutes, faults)
    jepsen(f"RANDOM-{jepsen_settings.seed}", body)
