"""Calling into a backend without letting it take the profile down."""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
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


def run_with_timeout(
    fn: Callable[..., Any], *args: Any, timeout_s: float, name: str = "polyprof-call"
) -> CallOutcome:
    """Run ``fn(*args)`` on a daemon thread; give up waiting after `timeout_s` (the thread is abandoned).

    Returns an outcome whose `value` is the result, or the exception when `ok` is False.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as exc:
            box["error"] = exc

    worker = threading.Thread(target=run, name=name, daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        return CallOutcome(False, timed_out=True)
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
    """Run ``fn(*args)``; an exception becomes an error entry in `status` instead of propagating.

    With `timeout_s`, the call runs on a daemon thread and is abandoned (reported, never joined
    again) when it takes longer; the caller goes on.
    """
    if timeout_s is None:
        try:
            return CallOutcome(True, fn(*args))
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            status.errors.append(f"{what}() raised {describe(exc)}")
            return CallOutcome(False)

    outcome = run_with_timeout(fn, *args, timeout_s=timeout_s, name=f"polyprof-{status.name}-{what}")
    if outcome.timed_out:
        status.errors.append(f"{what}() did not return within {timeout_s:g} s and was abandoned")
    elif not outcome.ok:
        status.errors.append(f"{what}() raised {describe(outcome.value)}")
        outcome.value = None
    return outcome
