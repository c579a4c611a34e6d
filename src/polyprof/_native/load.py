"""Whether polyprof's C extension (``polyprof._native._speedups``) loads here, and if not, why."""

from __future__ import annotations

import os
import sys
from types import ModuleType

#: whether setup.py builds the extension here (its condition: CPython on Linux)
BUILT_HERE = sys.platform.startswith("linux") and sys.implementation.name == "cpython"

extension: ModuleType | None
#: None while the extension is in use; otherwise why not, and what to do about it
why_pure: str | None = None
#: whether it is not in use although it should have been (built here, not turned off)
extension_missing = False

if os.environ.get("POLYPROF_PURE_PYTHON", "") not in ("", "0"):
    extension = None
    why_pure = "POLYPROF_PURE_PYTHON is set; unset it for the C recorder"
else:
    try:
        from polyprof._native import _speedups as extension
    except ImportError as exc:  # not built (no compiler, another platform)
        extension = None
        if BUILT_HERE:
            extension_missing = True
            why_pure = (
                f"polyprof's C extension did not load ({exc}); with a C compiler and Python's headers "
                "installed (e.g. apt install gcc python3-dev), reinstall polyprof to build it"
            )
        else:
            why_pure = f"polyprof's C extension is built for CPython on Linux only, not {sys.platform}"


def reject(reason: str) -> None:
    """Leave the extension unused (it loaded, but lacks what this polyprof needs)."""
    global extension, why_pure, extension_missing
    extension, why_pure, extension_missing = None, reason, True
