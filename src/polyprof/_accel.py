"""Whether the optional C hot path (``polyprof._speedups``) is in use, and if not, why.

Set ``POLYPROF_PURE_PYTHON=1`` to force the pure-Python implementation (tests run both). When the
extension is missing, polyprof still works, but a span costs several times more while profiling
(BENCHMARKS.md: the pure ``with record_function`` ~0.15 of torch.profiler's, the C one ~0.02), so
the reason is kept for ``polyprof backends`` and for each trace's host backend status::

    >>> from polyprof import _accel
    >>> _accel.recorder_description()      # doctest: +SKIP
    'C (polyprof._speedups)'
"""

from __future__ import annotations

import os
import sys
from types import ModuleType

#: whether setup.py tries to build the extension here (its condition: CPython on Linux)
BUILT_HERE = sys.platform.startswith("linux") and sys.implementation.name == "cpython"

speedups: ModuleType | None
#: None while the C path is in use; otherwise why not, and what to do about it
pure_python_reason: str | None = None
#: whether the pure path is in use although the C one should have been (built here, not turned off)
extension_missing = False

if os.environ.get("POLYPROF_PURE_PYTHON", "") not in ("", "0"):
    speedups = None
    pure_python_reason = "POLYPROF_PURE_PYTHON is set; unset it for the C recorder"
else:
    try:
        from polyprof import _speedups as speedups
    except ImportError as exc:  # not built (no compiler, other platform): the Python path is used
        speedups = None
        if BUILT_HERE:
            extension_missing = True
            pure_python_reason = (
                f"polyprof's C extension did not load ({exc}); with a C compiler and Python's headers "
                "installed (e.g. apt install gcc python3-dev), reinstall polyprof to build it"
            )
        else:
            pure_python_reason = f"polyprof's C extension is built for CPython on Linux only, not {sys.platform}"


def recorder_description() -> str:
    """Which recorder takes spans, instants and counters: ``C (polyprof._speedups)`` or
    ``pure Python (<why, and what to do>)``."""
    if pure_python_reason is None:
        return "C (polyprof._speedups)"
    return f"pure Python ({pure_python_reason})"
