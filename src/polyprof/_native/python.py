"""The door's names without the extension: the recorder's Python twin (twins/recorder.py), the
columns' (twins/columns.py), the writers' (twins/writers.py), and for every other function its answer "declined" (None, or the
scanners' DECLINED), on which the caller runs its reference path; the Python call tracer, which has
none, raises :class:`NeedsExtension`."""

from __future__ import annotations

from typing import Any

from polyprof._native import load
from polyprof._native.shared import DECLINED, SIDE_NAMES, NeedsExtension
from polyprof._native.shared import host_ns as clock_ns  # noqa: F401
from polyprof._native.twins.columns import (  # noqa: F401
    code_strings,
    nesting_levels,
    present_rows,
    walk_tagged_records,
)
from polyprof._native.twins.recorder import (  # noqa: F401 - exported by __all__ (SIDE_NAMES)
    EventBuffer,
    RecordFunction,
    SpanCall,
    configure,
    counter,
    current_external_id,
    external_id_reader,
    instant,
    new_ids,
    next_id,
    set_active,
    set_bridge,
    set_has_targets,
    thread_buffer,
    thread_context_fast,
)
from polyprof._native.twins.writers import format_activities, format_arg_objects, slice_events  # noqa: F401


def _declined(*_: Any) -> None:
    return None


def _scanner_declined(*_: Any) -> int:
    return DECLINED


def _needs_extension(*_: Any) -> Any:
    raise NeedsExtension(f"needs polyprof's C extension, not in use here: {load.why_pure}")


# the merge's passes, the writers' encoders, the readers' scanners: the caller's reference path runs
ordered_rows = interleave_ordered = take_two = innermost_open = _declined
encode_events = encode_json_args = _declined
scan_packets = packet_rewriter = packet_scanner = scan_packets_feed = scan_packets_result = scan_packets_take = _declined
scan_packets_counts = _declined
events_array_start = scan_events = _scanner_declined
rewrite_rank_events = rewrite_packets = _needs_extension  # (only after a scanner or rewriter took the file)


# the runtime: the clock is the host clock, no TSC, no row chunks to lend
def clock_source() -> str:
    return "clock_gettime"


def tsc_clock_addresses() -> tuple[int, int, int]:
    return (0, 0, 0)


def row_chunk_functions() -> tuple[int, int, int]:
    return (0, 0, 0)


warm_row_chunks = _declined
crash_rows_arm = crash_rows_disarm = _declined  # (no rows are written at a crash: the spill's last flush is all)


def row_chunks_stats() -> dict[str, Any]:
    return {}


pytrace_start = pytrace_stop = pytrace_thread_hook = _needs_extension
pytrace_mon_py_start = pytrace_mon_py_end = pytrace_mon_call = pytrace_mon_c_end = _needs_extension

__all__ = list(SIDE_NAMES)
