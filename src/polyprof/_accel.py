"""Whether the optional C hot path (``polyprof._speedups``) is in use.

Set ``POLYPROF_PURE_PYTHON=1`` to force the pure-Python implementation (tests run both).
"""

from __future__ import annotations

import os
from types import ModuleType

speedups: ModuleType | None
if os.environ.get("POLYPROF_PURE_PYTHON", "") not in ("", "0"):
    speedups = None
else:
    try:
        from polyprof import _speedups as speedups
    except ImportError:  # not built (no compiler, other platform): the Python path is used
        speedups = None
