"""Which span was open on a thread when a call started: the question behind launch attribution and
device-side annotation spans, answered for every call at once.

A span is open at a call on its thread when it orders before the call (start, longer first on equal
starts, spans before calls on full ties) and has not ended before the call starts; of those, the
innermost is the one that started last. This is exactly what walking each thread with a stack gives,
for properly nested spans and for spans that overlap without nesting (asyncio tasks interleaving on
one thread), and it is computed here without a loop per row: spans are ordered per thread, and "the
last span before position p whose end is at least t" is found with a sparse table of running maxima
of span ends, built only as deep as the farthest answer needs. Where polyprof's C extension is built,
the same answer comes from one walk with a stack per thread (``innermost_open`` in
``_native/csrc/merge_passes.c``), without the GIL.
"""

from __future__ import annotations

import numpy as np

from polyprof import _native
from polyprof.merge.order import rank_in_order
from polyprof.model.args import sorted_unique

NONE = -1


def thread_codes(device: np.ndarray, resource: np.ndarray) -> np.ndarray:
    """A small dense code per (device, resource) pair."""
    key = device.astype(np.int64) * (1 << 32) + resource.astype(np.int64)
    uniq = sorted_unique(key)
    codes = np.searchsorted(uniq, key)
    return codes.astype(np.uint16 if len(uniq) < (1 << 16) else np.int64)


def innermost_open_span(
    start: np.ndarray, end: np.ndarray, thread: np.ndarray, spans: np.ndarray, calls: np.ndarray
) -> np.ndarray:
    """For each row in `calls`, the row in `spans` innermost open on the same thread when the call
    started, or -1. `spans` and `calls` are row indices, each already in the trace's order (by start,
    longer first); `thread` is a per-row code (see :func:`thread_codes`)."""
    found = np.full(len(calls), NONE, dtype=np.int64)
    if not len(spans) or not len(calls):
        return found
    walked = _native.innermost_open(start, end, thread, spans, calls)
    if walked is not None:
        return walked
    code = thread.astype(np.uint16) if int(thread.max()) < (1 << 16) else thread  # radix-sorted below
    # per thread, keeping the start order within each (a stable sort on a small integer code)
    spans = spans[np.argsort(code[spans], kind="stable")]
    by_thread = np.argsort(code[calls], kind="stable")
    calls_sorted = calls[by_thread]
    s_thread, c_thread = thread[spans].astype(np.int64), thread[calls_sorted].astype(np.int64)
    s_start, s_end, c_start = start[spans], end[spans], start[calls_sorted]
    s_dur, c_dur = s_end - s_start, end[calls_sorted] - c_start
    t0 = int(min(s_start.min(), c_start.min()))
    span_range = int(max(s_end.max(), c_start.max())) - t0 + 1
    threads = int(max(s_thread.max(), c_thread.max())) + 1
    last = np.full(len(calls), NONE, dtype=np.int64)
    if threads * span_range < (1 << 62):
        # (thread, time) packed into one int64: every comparison below stays within a thread
        base_s, base_c = s_thread * span_range - t0, c_thread * span_range - t0
        last[:] = _innermost(s_start + base_s, s_end + base_s, s_dur, c_start + base_c, c_dur)
    else:  # times too far apart to pack: thread by thread (a loop over threads, not rows)
        s_bounds = np.searchsorted(s_thread, np.arange(threads + 1))
        c_bounds = np.searchsorted(c_thread, np.arange(threads + 1))
        for t in range(threads):
            a, b, c0, c1 = s_bounds[t], s_bounds[t + 1], c_bounds[t], c_bounds[t + 1]
            if c0 < c1 and a < b:
                got = _innermost(s_start[a:b], s_end[a:b], s_dur[a:b], c_start[c0:c1], c_dur[c0:c1])
                last[c0:c1] = np.where(got >= 0, got + a, NONE)
    ok = last >= 0
    out = np.full(len(calls), NONE, dtype=np.int64)
    out[ok] = spans[last[ok]]
    found[by_thread] = out
    return found


def _innermost(s_key: np.ndarray, s_end: np.ndarray, s_dur: np.ndarray, c_key: np.ndarray, c_dur: np.ndarray) -> np.ndarray:
    """Within one ordered key space: for each call, the index of the last span ordering before it whose
    end reaches it, or -1."""
    before = rank_in_order(s_key, s_dur, c_key, c_dur) - 1
    result = np.full(len(c_key), NONE, dtype=np.int64)
    reach = np.maximum.accumulate(s_end)  # no span up to here reaches the call: no answer, at once
    maybe = np.flatnonzero(before >= 0)
    maybe = maybe[reach[before[maybe]] >= c_key[maybe]]
    result[maybe] = _last_reaching(s_end, before[maybe], c_key[maybe])
    return result


def _last_reaching(ends: np.ndarray, last: np.ndarray, t: np.ndarray) -> np.ndarray:
    """For each query, the largest index p <= last[q] with ends[p] >= t[q], or -1."""
    result = np.full(len(last), NONE, dtype=np.int64)
    pending = np.flatnonzero(last >= 0)
    if not len(pending):
        return result
    levels = [ends]  # levels[k][i] = max(ends[max(0, i - 2**k + 1) : i + 1])
    level_of = np.full(len(last), -1, dtype=np.int64)  # the first k whose block holds the answer
    k = 0
    while len(pending):
        hit = levels[k][last[pending]] >= t[pending]
        level_of[pending[hit]] = k
        pending = pending[~hit]
        pending = pending[last[pending] - (1 << k) + 1 > 0]  # the block reached index 0: no answer
        if len(pending):
            prev, step = levels[k], 1 << k
            grown = prev.copy()
            np.maximum(grown[step:], prev[:-step], out=grown[step:])
            levels.append(grown)
            k += 1
    found = np.flatnonzero(level_of >= 0)
    k_of = level_of[found]
    cur = last[found].copy()
    # the answer is in the lower half of block k: [cur - 2**k + 1, cur - 2**(k-1)]
    down = k_of >= 1
    cur[down] -= 1 << (k_of[down] - 1)
    for j in range(len(levels) - 3, -1, -1):
        active = np.flatnonzero(k_of - 2 >= j)
        if not len(active):
            continue
        here = cur[active]
        skip = levels[j][here] < t[found[active]]
        cur[active[skip]] = here[skip] - (1 << j)
    result[found] = cur
    return result
