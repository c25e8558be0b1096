"""Which implementation of the per-message paths runs: the compiled extensions or pure Python.

Every user of a compiled module gets it through ``load``, so one switch selects the path for all:
``LAVINPY_PURE_PYTHON=1`` forces pure Python; otherwise a compiled module is used when it was built
(``pip install -e .`` builds it when a C compiler is present) and the pure-Python code when it was not.
Nothing is logged here: the broker reports ``COMPILED`` at startup.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["COMPILED", "PURE_PYTHON_REQUESTED", "SOCKET_THREADS", "cclient", "csocket", "cwire", "load"]

PURE_PYTHON_REQUESTED: bool = os.environ.get("LAVINPY_PURE_PYTHON", "") == "1"


def load(name: str) -> ModuleType | None:
    """The compiled module ``name``, or None when pure Python is requested or it was not built."""
    if PURE_PYTHON_REQUESTED:
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


cwire: ModuleType | None = load("lavinpy.wire._cwire")
# SocketWriter / SocketReader: a busy connection's send() and recv() calls in threads that never take
# the GIL (the second core).
csocket: ModuleType | None = load("lavinpy.wire._csocket")
# Which of those threads busy connections get: LAVINPY_SOCKET_THREADS, a comma list of "reader" and
# "writer" (default both; empty or "0": none, the event loop does all socket calls), for comparisons.
SOCKET_THREADS: frozenset[str] = frozenset(
    part.strip() for part in os.environ.get("LAVINPY_SOCKET_THREADS", "reader,writer").split(",")
    if part.strip() in ("reader", "writer")
) if csocket is not None else frozenset()
# The blocking clients' runs of publishes and deliveries (lavinpy.wire.client).
cclient: ModuleType | None = load("lavinpy.wire._cclient")

# True when the codec's compiled path runs.
COMPILED: bool = cwire is not None
