"""One recording profile per process: backends' recorders are process-wide (torch's observer, the
Python tracer), so a second profile may not record while one does. The recording one may give way
(``yield_to``: ``polyprof run``'s whole-run profile yields when the script starts its own).

::

    claim(profile)       # before its recorders start; PolyprofError if another records and will not yield
    release(profile)     # as its recorders stop
"""

from __future__ import annotations

import threading
from typing import Any

from polyprof.errors import PolyprofError

_lock = threading.Lock()
_recording: Any = None


def claim(profile: Any) -> None:
    """Make `profile` the one that records; the one recording first yields if it can, else an error."""
    global _recording
    with _lock:
        other = _recording if _recording is not profile else None
    if other is not None and other.yield_to is not None:
        other.yield_to(profile)  # it must stop (and so release) itself
    with _lock:
        if _recording is not None and _recording is not profile:
            raise PolyprofError(
                "another polyprof profile is already recording in this process; stop it first"
            )
        _recording = profile


def release(profile: Any) -> None:
    """`profile` no longer records."""
    global _recording
    with _lock:
        if _recording is profile:
            _recording = None
