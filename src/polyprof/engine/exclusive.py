"""One recording profile per process: backends' recorders are process-wide (torch's observer, the
Python tracer), so a second profile may not record while one does. The recording one may give way
(``yield_to``: ``polyprof run``'s whole-run profile yields when the script starts its own).

::

    claim(profile)       # before its recorders start; ProfilerBusyError (a RuntimeError) if another records and will not yield
    release(profile)     # as its recorders stop
"""

from __future__ import annotations

import threading
from typing import Any

from polyprof.errors import ProfilerBusyError

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
            raise ProfilerBusyError(
                "another polyprof profile is already recording in this process; stop it first"
            )
        _recording = profile


def give_way(other: Any) -> None:
    """Ask the recording profile to yield to `other` (a profiler that is not polyprof's, such as torch's
    own); one that cannot yield goes on recording."""
    with _lock:
        recording = _recording
    if recording is not None and recording.yield_to is not None:
        recording.yield_to(other)


def release(profile: Any) -> None:
    """`profile` no longer records."""
    global _recording
    with _lock:
        if _recording is profile:
            _recording = None
