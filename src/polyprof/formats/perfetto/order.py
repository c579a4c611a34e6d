"""Slices in the order Perfetto needs: every track's slices strictly nested, begin and end events in
time order.

Perfetto pairs a track's slice ends with its begins like a stack and drops slices that do not nest, so
work that overlaps on one row (asyncio tasks on a thread, CUDA graphs or PTI queues on a stream) is
spread over *lanes*: lane 0 is the row's own track, lanes 1.. are sibling tracks. One pass in start
order places each slice on the first lane where it nests, and emits every event in time order (ends
at a time before begins at that time, inner ends before outer ones)::

    events, lane = slice_events(track, start, end, instant)
    row, phase = events >> 2, events & 3        # phase BEGIN, END or INSTANT

In C where polyprof's extension is in use (``_native.slice_events``), else the same in Python.
"""

from __future__ import annotations

import heapq

import numpy as np

from polyprof import _native

BEGIN, END, INSTANT = 0, 1, 2


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
    sliced = _native.slice_events(track, start, end, instant, order)
    if sliced is None:
        return slice_events_py(track, start, end, instant, order)
    return np.frombuffer(sliced[0], dtype=np.int64), np.frombuffer(sliced[1], dtype=np.int32)


def slice_events_py(
    track: np.ndarray, start: np.ndarray, end: np.ndarray, instant: np.ndarray, order: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The reference of ``_native.slice_events`` (the same result)."""
    n = len(order)
    lane = np.zeros(n, dtype=np.int32)
    out: list[int] = []
    pending: list[tuple[int, int, int]] = []  # (end, -begin number, row): the inner of equal ends first
    lanes: dict[int, list[list[int]]] = {}  # track -> each lane's stack of open ends
    track_l, start_l, end_l, instant_l = track.tolist(), start.tolist(), end.tolist(), instant.tolist()
    begun = 0
    for row in order.tolist():
        s = start_l[row]
        while pending and pending[0][0] <= s:
            out.append(heapq.heappop(pending)[2] << 2 | END)
        if instant_l[row]:
            out.append(row << 2 | INSTANT)
            continue
        e = end_l[row]
        stacks = lanes.setdefault(track_l[row], [])
        k = 0
        while k < len(stacks):
            stack = stacks[k]
            while stack and stack[-1] <= s:
                stack.pop()
            if not stack or stack[-1] >= e:
                break
            k += 1
        if k == len(stacks):
            stacks.append([])
        stacks[k].append(e)
        lane[row] = k
        out.append(row << 2 | BEGIN)
        begun += 1
        heapq.heappush(pending, (e, -begun, row))
    while pending:
        out.append(heapq.heappop(pending)[2] << 2 | END)
    return np.array(out, dtype=np.int64), lane
