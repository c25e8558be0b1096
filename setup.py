"""The optional C extensions; the package metadata is in pyproject.toml.

A missing compiler is not an error (``optional=True``): the pure-Python code is used instead.
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("lavinpy.store._cstore", ["lavinpy/store/_cstore.c"], optional=True),
])
