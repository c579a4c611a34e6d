"""Vendor facilities that allow one user at a time, as a contract fact backends declare and query.

CUPTI takes one subscriber per process: whoever holds it (torch's own collector, polyprof's CUDA
backend) must be known to the others, which then adapt (the CUDA backend takes the buffers back for
the profile's duration) instead of importing each other::

    facilities.hold("cupti", "torch")          # torch's collector starts Kineto
    facilities.holder("cupti")                 # -> "torch"
    facilities.release("cupti", "torch")

A backend lists what it takes in its ``facilities`` attribute (shown by ``polyprof backends``); a
session uses ``ctx.hold_facility`` / ``ctx.facility_holder``. Holds nest: the latest holder is
reported until it releases.
"""

from __future__ import annotations

import threading

#: CUPTI's single subscriber (CUDA activity and callback APIs)
CUPTI = "cupti"

_lock = threading.Lock()
_holders: dict[str, list[str]] = {}


def hold(facility: str, holder: str) -> None:
    with _lock:
        _holders.setdefault(facility, []).append(holder)


def release(facility: str, holder: str) -> None:
    """Give back one hold of `holder` (a release without a hold is ignored)."""
    with _lock:
        stack = _holders.get(facility, [])
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] == holder:
                del stack[i]
                break


def holder(facility: str) -> str | None:
    with _lock:
        stack = _holders.get(facility)
        return stack[-1] if stack else None
