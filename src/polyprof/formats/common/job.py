"""What a trace says of its place in a job, and which files a job's traces are: shared by merge, the
store and the rank analyses::

    files = trace_files(["traces/"])          # the trace files named, folders expanded
    rank_of(trace, fallback=3)                # distributedInfo's rank, else the fallback
    recorded_offset(trace)                    # (ns to rank 0's clock, uncertainty) as recorded, or (None, None)
"""

from __future__ import annotations

import os
from typing import Any

from polyprof.errors import ConfigError

TRACE_SUFFIXES = (".json", ".json.gz", ".pftrace", ".pftrace.gz", ".perfetto-trace", ".perfetto-trace.gz")


def trace_files(paths: list[str]) -> list[str]:
    """The trace files named, folders expanded to the traces in them (sorted)."""
    out: list[str] = []
    for p in paths:
        if os.path.isdir(p):
            out += sorted(os.path.join(p, f) for f in os.listdir(p) if f.endswith(TRACE_SUFFIXES))
        else:
            out.append(p)
    if not out:
        raise ConfigError("no trace files given (or none with a trace suffix in the folders named)")
    return out


def rank_of(trace: Any, fallback: int) -> int:
    info = trace.metadata.get("distributedInfo")
    rank = info.get("rank") if isinstance(info, dict) else None
    return rank if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0 else fallback


def recorded_offset(trace: Any) -> tuple[int | None, int | None]:
    """(offset to rank 0's clock, its uncertainty) in ns as the trace recorded it, or (None, None)."""
    for status in trace.backends.values():
        sync = status.clock.get("to rank 0")
        if isinstance(sync, dict) and isinstance(sync.get("offset_ns"), int):
            return sync["offset_ns"], sync.get("uncertainty_ns")
    return None, None
