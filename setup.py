"""Only the optional C extension is declared here; everything else is in pyproject.toml.

The extension (src/polyprof/csrc, one file per job) speeds up record_function, the Chrome writer and
the host backend's conversion; when it cannot be built (no C compiler, non-Linux clock),
installation still succeeds and polyprof uses its pure-Python implementation.
"""

import sys

from setuptools import Extension, setup

ext_modules = []
if sys.platform.startswith("linux") and sys.implementation.name == "cpython":
    files = ("module", "recorder", "chrome_format", "columns", "perfetto_format", "merge_events")
    sources = [f"src/polyprof/csrc/{name}.c" for name in files]
    ext_modules.append(
        Extension("polyprof._speedups", sources, depends=["src/polyprof/csrc/speedups.h"], optional=True)
    )

setup(ext_modules=ext_modules)
