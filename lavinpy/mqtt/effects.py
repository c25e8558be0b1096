"""What an MQTT connection asks of the adapter that drives it (``transport``): close, pause or resume
reading, set its one timer."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Effect(Enum):
    CLOSE = "close"
    PAUSE_READING = "pause_reading"
    RESUME_READING = "resume_reading"


@dataclass(frozen=True, slots=True)
class SetTimer:
    delay: float
