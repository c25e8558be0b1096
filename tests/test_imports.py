"""Every module of lavinpy imports (route modules and optional faces are imported lazily at run time,
so a broken import there would otherwise surface only when that face starts)."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import lavinpy

MODULES = sorted(m.name for m in pkgutil.walk_packages(lavinpy.__path__, "lavinpy."))


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name: str) -> None:
    importlib.import_module(name)
