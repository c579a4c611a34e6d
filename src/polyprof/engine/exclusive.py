"""One recording profile per process: backends' recorders are process-wide (torch's observer, the
Python tracer), so a second profile may not record while one does. The recording one may give way
(``yield_to``: ``polyprof run``'s whole-run profile ends there; the flight recorder steps aside and
records again once the other stops, through ``when_free``).

::

    claim(profile)       # before its recorders start; ProfilerBusyError (a RuntimeError) if another records and will not yield
    release(profile)     # as its recorders stop
    free()               # its hand-over under way: those that yielded start again
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from polyprof.errors import ProfilerBusyError

_lock = threading.Lock()
_recording: Any = None
_waiting: list[Callable[[], None]] = []  # profiles that yielded, to start again once none records
_released: Any = None  # (a weak reference to) the last profile that stopped: it may still be handing over


def claim(profile: Any) -> None:
    """Make `profile` the one that records; the one recording first yields if it can, else an error."""
    global _recording
    if _recording is not profile:
        give_way(profile)  # (the recording one must stop, and so release, itself)
    previous = _released() if _released is not None else None
    if previous is not None and previous is not profile:  # torch's observer is one per process: the last
        previous.wait_collected()  # window's rows are read before it records again (and clears them)
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
    if recording is not None and recording is not other and recording.yield_to is not None:
        recording.yield_to(other)


def when_free(callback: Callable[[], None]) -> None:
    """Call `callback` once no profile records any more (a profile that yielded, starting again)."""
    with _lock:
        _waiting.append(callback)


def free() -> None:
    """No polyprof profile records now (and, called by the guard of torch's own profiler, neither does
    torch's): those that yielded start again, in the order they yielded."""
    with _lock:
        if _recording is not None:
            return
        callbacks = _waiting[:]
        _waiting.clear()
    for callback in callbacks:
        callback()


def release(profile: Any) -> None:
    """`profile` no longer records (its backends may still hand over: see ``wait_collected``); once its
    hand-over is under way, the caller calls :func:`free` so that a profile that yielded starts again."""
    global _recording, _released
    with _lock:
        if _recording is not profile:
            return
        _recording = None
        _released = weakref.ref(profile)
