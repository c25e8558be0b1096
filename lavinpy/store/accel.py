"""Which implementation of the store's per-message path runs: the C extension or pure Python.

``_cstore`` (built from _cstore.c by setup.py, optional) is used when it was built, unless the
environment sets ``LAVINPY_PURE_PYTHON=1``. Both behave identically; the pure-Python code stays the
reference (tests/store/test_cstore_equivalence.py runs them side by side).
"""

from __future__ import annotations

import os
from types import ModuleType

cstore: ModuleType | None = None
if os.environ.get("LAVINPY_PURE_PYTHON") != "1":
    try:
        from lavinpy.store import _cstore as cstore
    except ImportError:  # not built (no compiler at install time): the pure-Python path
        cstore = None

COMPILED: bool = cstore is not None

__all__ = ["COMPILED", "cstore"]
