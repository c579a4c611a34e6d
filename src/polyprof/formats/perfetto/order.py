"""Slices in the order Perfetto needs: every track's slices strictly nested, begin and end events in
time order.

Perfetto pairs a track's slice ends with its begins like a stack and drops slices that do not nest, so
work that overlaps on one row (asyncio tasks on a thread, CUDA graphs or PTI queues on a stream) is
spread over *lanes*: lane 0 is the row's own track, lanes 1.. are sibling tracks. One pass in start
order places each slice on the first lane where it nests, and emits every event in time order (ends
at a time before begins at that time, inner ends before outer ones)::

    events, lane = slice_events(track, start, end, instant)
    row, phase = events >> 2, events & 3        # phase: _native.shared's SLICE_BEGIN, SLICE_END, SLICE_INSTANT

In C where polyprof's extension is in use (``_native.slice_events``), else its Python twin.
"""

from __future__ import annotations

import numpy as np

from polyprof import _native


def start_order(start: np.ndarray) -> np.ndarray:
    """Row indices in start order (stable); rows the merge wrote are already in it."""
    if len(start) < 2 or bool(np.all(start[1:] >= start[:-1])):
        return np.arange(len(start), dtype=np.int64)
    return np.argsort(start, kind="stable").astype(np.int64)


def slice_events(
    track: np.ndarray, start: np.ndarray, end: np.ndarray, instant: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(events, lane): events as ``row << 2 | phase`` in emission order, and each row's lane (0 for
    instants). `track` is any integer id of a row's track; `instant` marks rows without duration."""
    track = np.ascontiguousarray(track, dtype=np.int64)
    start = np.ascontiguousarray(start, dtype=np.int64)
    end = np.maximum(np.ascontiguousarray(end, dtype=np.int64), start)
    instant = np.ascontiguousarray(instant, dtype=np.int8)
    order = start_order(start)
    events, lane = _native.slice_events(track, start, end, instant, order)
    return np.frombuffer(events, dtype=np.int64), np.frombuffer(lane, dtype=np.int32)
