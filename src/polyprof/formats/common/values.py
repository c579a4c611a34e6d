"""Values as trace files hold them, read one way by every reader.

::

    us_to_ns(12.5, path, "an event")   # 12500: Kineto's microseconds as integer nanoseconds
    hashable([1, 2])                   # "[1,2]": a pid or tid usable as a key
"""

from __future__ import annotations

import math
from typing import Any

import orjson

from polyprof.errors import TraceFormatError
from polyprof.model import TRACE_TIME_LIMIT_NS


def us_to_ns(value: Any, path: str, what: str) -> int:
    """Microseconds (number or numeric string, as Kineto writes) -> integer ns."""
    if isinstance(value, bool) or value is None:
        raise TraceFormatError(f"{path}: {what} has no valid timestamp")
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise TraceFormatError(f"{path}: {what} has a non-numeric timestamp {value!r}") from None
    if isinstance(value, int):
        ns = value * 1000
    elif isinstance(value, float) and math.isfinite(value):
        ns = int(round(value * 1000))
    else:
        raise TraceFormatError(f"{path}: {what} has a non-numeric or non-finite timestamp {str(value)[:40]!r}")
    if not -TRACE_TIME_LIMIT_NS <= ns <= TRACE_TIME_LIMIT_NS:
        raise TraceFormatError(f"{path}: {what} has a timestamp out of range ({value})")
    return ns


def hashable(value: Any) -> Any:
    """A pid or tid usable as a key (a list or dict given as one becomes its text)."""
    try:
        hash(value)
        return value
    except TypeError:
        return orjson.dumps(value, default=repr).decode()
