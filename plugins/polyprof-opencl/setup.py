"""Only the optional C interceptor is declared here; everything else is in pyproject.toml. Without a C
compiler the plugin installs anyway and wraps pyopencl's functions in Python (same records)."""

import sys

from setuptools import Extension, setup

ext_modules = []
if sys.platform.startswith("linux") and sys.implementation.name == "cpython":
    ext_modules.append(
        Extension("polyprof_opencl._intercept", ["src/polyprof_opencl/_intercept.c"], optional=True)
    )

setup(ext_modules=ext_modules)
