"""Giving freed memory back to the system.

A profile's columns are freed when the profile (and its trace) are, but glibc keeps freed heap memory
for reuse, so a process that captured 2 M events stays hundreds of MiB larger until its next large
allocation. After a window's parts are merged, and when a trace is garbage-collected, the engine asks
the allocator to return what it holds free (glibc's ``malloc_trim``; nothing elsewhere)::

    release_free_memory()
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from typing import Any

_trim: Any = None
if sys.platform.startswith("linux"):
    try:
        _trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        _trim.argtypes, _trim.restype = [ctypes.c_size_t], ctypes.c_int
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        _trim = None


def release_free_memory() -> None:
    if _trim is not None:
        _trim(0)
