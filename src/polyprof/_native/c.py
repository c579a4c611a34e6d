"""The door's names over polyprof's C extension: its functions as they are where the caller's types
are the C ones, and thin adapters where the door takes numpy arrays and lists (the inputs C does not
take are declined, as its Python side declines everything: see :mod:`polyprof._native`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from polyprof._native.load import extension as _c
from polyprof._native.shared import SIDE_NAMES, np
from polyprof._native.twins import columns as twin

assert _c is not None, "polyprof._native.c is imported only where the extension loaded"

# -- the recorder: the C functions themselves ---------------------------------------------------------
next_id = _c.next_id
current_external_id = _c.current_external_id
external_id_reader = _c.external_id_reader
thread_context_fast = _c.thread_context_fast
set_has_targets = _c.set_has_targets
set_active = _c.set_active
configure = _c.configure
thread_buffer = _c.thread_buffer
instant = _c.instant
counter = _c.counter
RecordFunction = _c.RecordFunction
SpanCall = _c.SpanCall
EventBuffer = _c.EventBuffer


def new_ids(n: int) -> np.ndarray:
    first = _c.reserve_ids(n)
    return np.arange(first, first + n, dtype=np.int64)


def set_bridge(bridge: Any, routed: Any, args_text: Any) -> None:
    consumers, enter, exit_ = bridge.c_addresses if bridge is not None else (0, 0, 0)
    _c.set_bridge(consumers, enter, exit_, routed, args_text)


# -- columns ------------------------------------------------------------------------------------------
def code_strings(values: Sequence[Any]) -> tuple[np.ndarray, list[Any]]:
    if not isinstance(values, list):
        return twin.code_strings(values)
    raw, table = _c.code_strings(values)
    return np.frombuffer(raw, dtype=np.int64), table


def present_rows(values: Sequence[Any]) -> np.ndarray:
    if not isinstance(values, list):
        return twin.present_rows(values)
    return np.frombuffer(_c.present_rows(values), dtype=np.int64)


walk_tagged_records = _c.walk_tagged_records
nesting_levels = _c.nesting_levels


# -- the merge's passes -------------------------------------------------------------------------------
def ordered_rows(order: np.ndarray, mask: np.ndarray) -> np.ndarray | None:
    if order.dtype != np.int64 or mask.dtype != np.bool_:
        return None
    return np.frombuffer(_c.ordered_rows(order, mask), dtype=np.int64)


def interleave_ordered(
    start: np.ndarray, end: np.ndarray, add_start: np.ndarray, add_end: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    existing_at, added_at = np.empty(len(start), dtype=np.int64), np.empty(len(add_start), dtype=np.int64)
    args = [np.ascontiguousarray(a, dtype=np.int64) for a in (start, end, add_start, add_end)]
    return (existing_at, added_at) if _c.interleave_ordered(*args, existing_at, added_at) else None


def take_two(first: np.ndarray, second: np.ndarray, source: np.ndarray) -> np.ndarray | None:
    out = np.empty(len(source), dtype=first.dtype)
    _c.take_two(np.ascontiguousarray(first), np.ascontiguousarray(second), source, out)
    return out


def innermost_open(
    start: np.ndarray, end: np.ndarray, thread: np.ndarray, spans: np.ndarray, calls: np.ndarray
) -> np.ndarray | None:
    if not (thread.dtype == np.int32 or int(thread.max()) < (1 << 31)) or int(thread.min()) < 0:
        return None
    found = np.full(len(calls), -1, dtype=np.int64)
    _c.innermost_open(
        np.ascontiguousarray(start, dtype=np.int64),
        np.ascontiguousarray(end, dtype=np.int64),
        np.ascontiguousarray(thread, dtype=np.int32),
        np.ascontiguousarray(spans, dtype=np.int64),
        np.ascontiguousarray(calls, dtype=np.int64),
        found,
    )
    return found


# -- writers and readers: the C functions themselves ----------------------------------------------------
format_activities = _c.format_activities
format_arg_objects = _c.format_arg_objects
slice_events = _c.slice_events
encode_events = _c.encode_events
encode_json_args = _c.encode_json_args
events_array_start = _c.events_array_start
scan_events = _c.scan_events
scan_packets = _c.scan_packets
packet_scanner = _c.packet_scanner
scan_packets_feed = _c.scan_packets_feed
scan_packets_result = _c.scan_packets_result
scan_packets_take = _c.scan_packets_take
scan_packets_counts = _c.scan_packets_counts
rewrite_rank_events = _c.rewrite_rank_events
packet_rewriter = _c.packet_rewriter
rewrite_packets = _c.rewrite_packets

# -- the runtime: clock, row chunks, the Python call tracer ----------------------------------------------
clock_ns = _c.clock_ns
clock_source = _c.clock_source
tsc_clock_addresses = _c.tsc_clock_addresses
row_chunk_functions = _c.row_chunk_functions
warm_row_chunks = _c.warm_row_chunks
row_chunks_stats = _c.row_chunks_stats
crash_rows_arm = _c.crash_rows_arm
crash_rows_disarm = _c.crash_rows_disarm
pytrace_start = _c.pytrace_start
pytrace_stop = _c.pytrace_stop
pytrace_thread_hook = _c.pytrace_thread_hook
pytrace_mon_py_start = _c.pytrace_mon_py_start
pytrace_mon_py_end = _c.pytrace_mon_py_end
pytrace_mon_call = _c.pytrace_mon_call
pytrace_mon_c_end = _c.pytrace_mon_c_end

__all__ = list(SIDE_NAMES)
