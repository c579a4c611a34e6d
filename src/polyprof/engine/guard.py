"""Calling into a backend without letting it take the profile down."""

from __future__ import annotations

import contextlib
import faulthandler
import os
import queue
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from polyprof.model import BackendStatus


class CallOutcome:
    __slots__ = ("ok", "value", "timed_out")

    def __init__(self, ok: bool, value: Any = None, timed_out: bool = False) -> None:
        self.ok = ok
        self.value = value
        self.timed_out = timed_out


def describe(exc: BaseException) -> str:
    return traceback.format_exception_only(type(exc), exc)[-1].strip()


GUARD_THREAD_NAME = "polyprof-guard"


class _Worker:
    """A daemon thread that runs guarded calls one after another. Reusing it spares each call a thread
    start (tens of microseconds idle, milliseconds when the CPUs are busy). A worker whose call timed out
    is abandoned with that call, and the next call gets a new worker."""

    def __init__(self) -> None:
        self.calls: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name=GUARD_THREAD_NAME, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            call = self.calls.get()
            if call is None:  # released: a burst of calls is over
                return
            fn, args, box, done = call
            try:
                box["value"] = fn(*args)
            except BaseException as exc:
                box["error"] = exc
            finally:
                done.set()
            del fn, args, box, done, call  # drop references to the finished call before waiting again


#: after a call's limit, the watchdog waits this much longer before it prints the stacks
WATCHDOG_GRACE_S = 5.0


def _watchdog_enabled() -> bool:
    return os.environ.get("POLYPROF_WATCHDOG", "1") not in ("0", "")


@contextlib.contextmanager
def _watchdog(what: str, timeout_s: float) -> Iterator[None]:
    """Arm faulthandler's watchdog (a C thread: it runs while a call holds the GIL) for one call: if
    the waiting thread is still blocked `WATCHDOG_GRACE_S` after the limit, every thread's stack goes to
    stderr (the stuck backend's frames are under polyprof's guard thread). POLYPROF_WATCHDOG=0 turns
    it off, e.g. for a program that uses faulthandler.dump_traceback_later itself."""
    if not _watchdog_enabled() or not hasattr(faulthandler, "dump_traceback_later"):
        yield
        return
    try:
        faulthandler.dump_traceback_later(timeout_s + WATCHDOG_GRACE_S, repeat=False, file=sys.stderr)
    except (ValueError, OSError, RuntimeError):  # no usable stderr
        yield
        return
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


_worker: _Worker | None = None
_worker_lock = threading.Lock()


def release_worker() -> None:
    """End the idle guard thread (after a burst of calls: a profile's probes, its sessions' starts,
    stops, collects): an idle thread left alive would be seen by tools that sample every thread of the
    process (torch's Python tracer counts it as a thread of the program)."""
    global _worker
    with _worker_lock:
        worker, _worker = _worker, None
    if worker is not None:
        worker.calls.put(None)
        worker.thread.join(1.0)


def run_with_timeout(fn: Callable[..., Any], *args: Any, timeout_s: float, what: str = "") -> CallOutcome:
    """Run ``fn(*args)`` on polyprof's guard thread; give up waiting after `timeout_s` (the thread is
    abandoned with the call). Calls from several threads at once each get their own thread.

    A call that hangs while holding the GIL cannot be given up on in-process (nothing else can run):
    for that case faulthandler's watchdog, which needs no GIL, prints every thread's stack to stderr
    shortly after the limit (see :func:`_watchdog`). Returns an outcome whose `value` is the result, or
    the exception when `ok` is False.
    """
    global _worker
    box: dict[str, Any] = {}
    done = threading.Event()
    with _worker_lock:
        worker, _worker = _worker, None  # taken: a concurrent call starts its own
    if worker is None:
        worker = _Worker()
    worker.calls.put((fn, args, box, done))
    with _watchdog(what or getattr(fn, "__qualname__", "a backend call"), timeout_s):
        finished = done.wait(timeout_s)
    if not finished:
        return CallOutcome(False, timed_out=True)  # the worker is not handed back: it is stuck
    with _worker_lock:
        if _worker is None:
            _worker = worker
    if "error" in box:
        return CallOutcome(False, box["error"])
    return CallOutcome(True, box.get("value"))


def guarded_call(
    status: BackendStatus,
    what: str,
    fn: Callable[..., Any],
    *args: Any,
    timeout_s: float | None = None,
) -> CallOutcome:
    """Run ``fn(*args)``; an exception becomes an error entry in `status` instead of propagating, a
    KeyboardInterrupt or SystemExit raised inside the backend included (it is the backend's failure,
    not the program's end).

    With `timeout_s`, the call runs on polyprof's guard thread and is abandoned (reported, never joined
    again) when it takes longer; the caller goes on.
    """
    if timeout_s is None:
        try:
            return CallOutcome(True, fn(*args))
        except BaseException as exc:
            status.errors.append(f"{what}() raised {describe(exc)}")
            return CallOutcome(False, exc)

    outcome = run_with_timeout(fn, *args, timeout_s=timeout_s, what=f"{status.name}: {what}()")
    if outcome.timed_out:
        status.errors.append(f"{what}() did not return within {timeout_s:g} s and was abandoned")
    elif not outcome.ok:
        status.errors.append(f"{what}() raised {describe(outcome.value)}")
        outcome.value = None
    return outcome
