"""The optional C extension of the codec; everything else is declared in pyproject.toml.

``optional=True``: without a C compiler the install still succeeds and lavinpy runs its pure-Python
codec (lavinpy.wire.accel selects the path at import).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("lavinpy.wire._cwire", ["lavinpy/wire/_cwire.c"], optional=True,
                  extra_compile_args=["-O2"]),
        # POSIX threads and sockets: not built where they are missing (the event loop then sends).
        Extension("lavinpy.wire._csocket", ["lavinpy/wire/_csocket.c"], optional=True,
                  extra_compile_args=["-O2"]),
    ],
)
