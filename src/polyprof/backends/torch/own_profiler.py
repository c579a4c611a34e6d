"""torch's own profiler starting while polyprof records this process's operators.

A torch.profiler or torch.autograd.profiler made with torch's own classes (``polyprof run
--no-torch-profiler``, a profiler captured before the switch, a library's) would share torch's
per-thread profiler state with polyprof's recording, and torch crashes. So, before torch's profiler
prepares, the polyprof profile that records operators gives way where it can (``polyprof run``'s
whole-run profile: its trace ends there and is written; the flight recorder: it steps aside and records
again when torch's profiler stops), and otherwise torch's profiler gets a RuntimeError saying what to
do::

    recording(session)       # a torch session records operators (the guard is put in place once)
    not_recording(session)   # it stopped
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from polyprof.engine import exclusive
from polyprof.errors import ProfilerBusyError

_lock = threading.Lock()
_sessions: set[int] = set()


def recording(session: Any, torch: Any) -> None:
    """`session` records torch's operators from now on; torch's profiler is guarded from here."""
    _guard(torch)
    with _lock:
        _sessions.add(id(session))


def not_recording(session: Any) -> None:
    with _lock:
        _sessions.discard(id(session))


def _busy() -> bool:
    with _lock:
        return bool(_sessions)


def _guard(torch: Any) -> None:
    """Wrap torch.autograd.profiler.profile._prepare_trace, where both of torch's profilers start."""
    cls = getattr(getattr(getattr(torch, "autograd", None), "profiler", None), "profile", None)
    original = getattr(cls, "_prepare_trace", None) if cls is not None else None
    if original is None or getattr(original, "polyprof_guard", False):
        return

    @functools.wraps(original)
    def _prepare_trace(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _busy():
            exclusive.give_way(self)
            if _busy():
                raise ProfilerBusyError(
                    "polyprof is recording this process's operators, and torch's own profiler cannot start "
                    "while it does (one profiler at a time): stop polyprof's profile first, or make this "
                    "profiler with polyprof.profiler.profile (POLYPROF_TORCH_PROFILER=1 does it for every one)"
                )
        return original(self, *args, **kwargs)

    exit_original = cls.__exit__

    @functools.wraps(exit_original)
    def __exit__(self: Any, *exc_info: Any) -> Any:
        try:
            return exit_original(self, *exc_info)
        finally:
            exclusive.free()  # torch's profiler stopped: a profile that stepped aside records again

    _prepare_trace.polyprof_guard = True  # type: ignore[attr-defined]
    cls._prepare_trace = _prepare_trace
    cls.__exit__ = __exit__
