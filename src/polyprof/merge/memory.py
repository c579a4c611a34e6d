"""Giving freed memory back to the system once a large trace is gone.

glibc keeps the pages of small blocks freed amid others (a profile's columns and conversion leave many)
for the process's next allocations, so a 2 M-event profile could leave tens of MiB resident after
every reference to it was dropped. ``release_when_collected(trace, rows)`` asks glibc to return what it
holds free (``malloc_trim``) after that object has been collected::

    trace = merge(...)
    release_when_collected(trace, len(trace.activities))

The trace's finalizer only marks the release as due; it happens at the end of the garbage collector's
next pass, when whatever the trace's owner held is freed too (an owner in a reference cycle included),
and in no other thread. Elsewhere (another C library, another OS) nothing is done.
"""

from __future__ import annotations

import ctypes
import gc
import sys
import weakref
from typing import Any

_trim: Any = None
if sys.platform.startswith("linux"):
    try:
        _trim = ctypes.CDLL(None).malloc_trim  # glibc's; absent from musl
        _trim.argtypes, _trim.restype = [ctypes.c_size_t], ctypes.c_int
    except (OSError, AttributeError):
        _trim = None

_due = False


def release_freed_memory() -> None:
    """Return the free pages the C allocator holds to the system (a few ms on a large heap)."""
    if _trim is not None:
        _trim(0)


def _mark_due() -> None:
    global _due
    _due = True


def _after_collection(phase: str, info: dict) -> None:
    global _due
    if phase == "stop" and _due:
        _due = False
        release_freed_memory()


#: Traces of fewer rows ask for no release: what they and their merge free is small, the allocator
#: reuses it for the next window, and a trim gives back every free page of the heap (the program's too),
#: which then faults in again (~0.15 ms and ~130 page faults after each small window on a 2-core VM).
RELEASE_MIN_ROWS = 100_000


def release_when_collected(obj: Any, rows: int) -> None:
    """Return freed memory after `obj`, of `rows` rows, is collected (at the end of the next garbage
    collection; not at exit), when it has at least :data:`RELEASE_MIN_ROWS`."""
    if _trim is None or rows < RELEASE_MIN_ROWS:
        return
    if _after_collection not in gc.callbacks:
        gc.callbacks.append(_after_collection)
    weakref.finalize(obj, _mark_due).atexit = False
