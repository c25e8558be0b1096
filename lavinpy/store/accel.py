"""Which implementation of the store's per-message path runs: the C extension or pure Python.

``_cstore`` (built from _cstore.c by setup.py, optional) is used when it was built, unless the
environment sets ``LAVINPY_PURE_PYTHON=1``: the one switch is lavinpy.wire.accel.load, shared with
the codec. Both behave identically; the pure-Python code stays the reference
(tests/store/test_cstore_equivalence.py runs them side by side).
"""

from __future__ import annotations

from types import ModuleType

from lavinpy.wire.accel import load

cstore: ModuleType | None = load("lavinpy.store._cstore")

COMPILED: bool = cstore is not None

__all__ = ["COMPILED", "cstore"]
