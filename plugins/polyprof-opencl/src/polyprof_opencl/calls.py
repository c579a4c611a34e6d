"""Recording the pyopencl calls this plugin intercepts.

The plugin keeps a :class:`CallColumns` and replaces a function by :func:`interceptor` (or by a Python
wrapper of its own when the plugin's C extension, ``polyprof_opencl._intercept``, is not built). While the columns are recording, each
call appends one record: ``spec, queue, event, start, end, tid, external_id, error, a, b, c``, where
`a`, `b`, `c` are chosen by `mode`::

    columns = CallColumns()
    fast = interceptor(original, spec, columns, mode=MODE_ARGS_1_2_3, fallback=lambda args, kwargs: (...))
    columns.begin()      # recording: calls are timed and recorded
    ...
    rows = columns.rows()
    columns.end()        # calls go straight through again

The C interceptor forwards the caller's arguments untouched (vectorcall), so a wrapped function costs a
few hundred nanoseconds per call while recording and close to nothing otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from polyprof.plugin import current_external_id_var

try:
    from polyprof_opencl import _intercept
except ImportError:  # not built (no compiler): intercept.py wraps in Python
    _intercept = None
else:
    _intercept.configure(current_external_id_var())

FIELDS = ("spec", "queue", "event", "start", "end", "tid", "external_id", "error", "a", "b", "c")
MODE_FALLBACK = 0  # a, b, c = fallback(args, kwargs)
MODE_ARGS_1_2_3 = 1  # a, b, c = the call's arguments 1, 2 and 3
MODE_NBYTES_OF_ARG = 2  # a = the `nbytes` of argument `pos` (or keyword `kw_name`)


class CallColumns:
    """Where intercepted calls are recorded: one list per field, or nothing when not recording."""

    def __init__(self) -> None:
        self.holder: list[Any] = [None]

    @property
    def columns(self) -> tuple[list, ...] | None:
        return self.holder[0]

    def begin(self) -> tuple[list, ...]:
        columns = tuple([] for _ in FIELDS)
        self.holder[0] = columns
        return columns

    def end(self) -> None:
        self.holder[0] = None

    @staticmethod
    def rows(columns: tuple[list, ...]) -> list[tuple]:
        n = min(len(c) for c in columns)  # a call on another thread may be mid-append
        return list(zip(*(c[:n] for c in columns), strict=True))


def interceptor(
    original: Callable,
    spec: Any,
    columns: CallColumns,
    *,
    mode: int,
    fallback: Callable[[tuple, dict], tuple[Any, Any, Any]],
    pos: int = 0,
    kw_name: str | None = None,
    handle_type: type | None = None,
    plain_event: Callable[[int, bool], Any] | None = None,
    retain_address: int = 0,
) -> Callable | None:
    """The C interceptor of `original`, or None when the plugin's C extension is not built.

    `handle_type`: results of that type (pyopencl's NannyEvent, which must not be kept alive by the
    profiler) are recorded as their raw ``int_ptr`` after calling the C function at `retain_address`
    on it (``clRetainEvent``; the backend then owns that reference), or as ``plain_event(int_ptr,
    True)`` when no address is given.
    """
    if _intercept is None or os.environ.get("POLYPROF_PURE_PYTHON", "") not in ("", "0"):
        return None
    return _intercept.Interceptor(
        original,
        spec,
        columns.holder,
        mode,
        pos,
        kw_name,
        fallback,
        handle_type if handle_type is not None else None,
        plain_event or (lambda *a: None),
        retain_address,
    )
