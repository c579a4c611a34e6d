"""Only the optional C extension is declared here; everything else is in pyproject.toml.

The extension speeds up record_function; when it cannot be built (no C compiler, non-Linux clock),
installation still succeeds and polyprof uses its pure-Python implementation.
"""

import sys

from setuptools import Extension, setup

ext_modules = []
if sys.platform.startswith("linux") and sys.implementation.name == "cpython":
    ext_modules.append(Extension("polyprof._speedups", ["src/polyprof/_speedups.c"], optional=True))

setup(ext_modules=ext_modules)
