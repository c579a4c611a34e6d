"""What polyprof's C extension and its Python side agree on, one text for both: the recorder's event
layout (_native/csrc/recorder.c and twins/recorder.py), the views of a thread's buffer that read either kind, and
the readers' answer for "read it the other way"."""

import time
from typing import Any, NamedTuple

#: the host clock, in ns: CLOCK_MONOTONIC on Linux. Every host timestamp is read from it (the C side
#: reads the same clock, or the TSC mapped onto it); :mod:`polyprof.plugin.clock` gives it to backends
host_ns = time.perf_counter_ns

#: the type of each event in a thread's buffer
SPAN = 0
INSTANT = 1
COUNTER = 2
GC = 3  # a garbage collection (recorded by the host backend with record_python_gc_info)
#: type, start, end, id, parent: the int64 columns of ``EventBuffer.snapshot()``
FIELDS = 5

#: flow types, as every row and the writers (C and Python) number them: Kineto's names for each
FLOW_NONE, FLOW_FWDBWD, FLOW_AC2G = 0, 1, 2  # none; forward op -> backward op; host launch -> device work
FLOW_NAMES = {FLOW_FWDBWD: "fwdbwd", FLOW_AC2G: "ac2g"}
#: a row's flags for ``format_activities`` (Chrome JSON): its correlation written, an instant, a flow's start
FLAG_CORRELATION, FLAG_INSTANT, FLAG_FLOW_START = 1, 2, 4
#: the phase of each event ``slice_events`` gives (``row << 2 | phase``)
SLICE_BEGIN, SLICE_END, SLICE_INSTANT = 0, 1, 2

#: what a scanner (``scan_events``, ``events_array_start``) answers for input it leaves to the
#: reference reader, and what every scanner answers without the extension
DECLINED = -4


class Routed(NamedTuple):
    """The buffered args of a span that was also a framework range: the user's args and the range's
    handle (torch's "Record function id")."""

    args: Any
    handle: int


class NeedsExtension(RuntimeError):
    """A feature with no Python path was called where polyprof's C extension is not in use."""


#: the names each side (c.py, python.py) exports, the same on both: the recorder (a Python twin)...
RECORDER_NAMES = (
    "EventBuffer", "RecordFunction", "SpanCall", "configure", "counter", "current_external_id",
    "external_id_reader", "instant", "new_ids", "next_id", "set_active", "set_bridge", "set_has_targets",
    "thread_buffer", "thread_context_fast",
)
#: ...the column helpers and two of the writers' encoders (Python twins)...
COLUMN_NAMES = ("code_strings", "present_rows", "walk_tagged_records", "nesting_levels", "format_activities",
                "format_arg_objects", "slice_events")
#: ...the accelerators (None, or DECLINED, without the extension)...
ACCELERATOR_NAMES = (
    "ordered_rows", "interleave_ordered", "take_two", "innermost_open", "encode_events", "encode_json_args", "events_array_start",
    "scan_events", "scan_packets", "packet_scanner", "scan_packets_feed", "scan_packets_result", "scan_packets_take", "scan_packets_counts", "rewrite_rank_events", "packet_rewriter", "rewrite_packets",
)
#: ...and the runtime (the clock, row chunks, the Python call tracer)
RUNTIME_NAMES = (
    "clock_ns", "clock_source", "tsc_clock_addresses", "row_chunk_functions", "warm_row_chunks",
    "row_chunks_stats", "pytrace_start", "pytrace_stop", "pytrace_thread_hook", "pytrace_mon_py_start",
    "pytrace_mon_py_end", "pytrace_mon_call", "pytrace_mon_c_end", "crash_rows_arm", "crash_rows_disarm",
)
SIDE_NAMES = RECORDER_NAMES + COLUMN_NAMES + ACCELERATOR_NAMES + RUNTIME_NAMES


class _NumpyOnUse:
    """numpy, imported at its first use: ``record_function`` alone never loads it (nor its import time)."""

    def __getattr__(self, name: str) -> Any:
        import numpy

        return getattr(numpy, name)


np: Any = _NumpyOnUse()


def snapshot(buffer: Any) -> tuple[Any, list, list]:
    """``(rows [n x 5] int64: type, start, end, id, parent; names; args)`` of either buffer kind."""
    rows, names, args = buffer.snapshot()
    if isinstance(rows, bytes):
        rows = np.frombuffer(rows, dtype=np.int64).reshape(-1, FIELDS)
    return rows, names, args


def open_states(buffer: Any) -> list[tuple]:
    """``(name, args, start, id, parent)`` of each span open in a live buffer (entered, not exited yet),
    outermost first::

        [state[0] for state in open_states(recorder.buffer())]   # the calling thread's open span names

    C's buffer lists the span objects (their ``open_state``: None once no longer open), the Python
    twin's the tuples themselves."""
    return [span if isinstance(span, tuple) else (span.name, span.args, *span.open_state)
            for span in buffer.open_spans() if isinstance(span, tuple) or span.open_state is not None]
