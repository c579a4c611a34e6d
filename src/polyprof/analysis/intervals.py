"""Interval arithmetic on numpy arrays of [start, end) times, for the analyses.

::

    covered = union_ns(starts, ends)                 # time covered at least once
    merged_s, merged_e = merge(starts, ends)         # the disjoint intervals they cover
    both = overlap_ns((s1, e1), (s2, e2))            # time covered by both sets
"""

from __future__ import annotations

import numpy as np


def merge(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The disjoint, sorted intervals that `start`/`end` cover (touching ones joined)."""
    if not len(start):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.argsort(start, kind="stable")
    s, e = np.asarray(start, np.int64)[order], np.maximum.accumulate(np.asarray(end, np.int64)[order])
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > e[:-1]
    groups = np.cumsum(new) - 1
    starts = s[new]
    ends = np.zeros(len(starts), np.int64)
    np.maximum.at(ends, groups, e)
    return starts, ends


def union_ns(start: np.ndarray, end: np.ndarray, lo: int | None = None, hi: int | None = None) -> int:
    """The time covered by the intervals (clipped to [lo, hi] when given)."""
    if lo is not None and hi is not None:
        start, end = np.clip(start, lo, hi), np.clip(end, lo, hi)
    s, e = merge(start, end)
    return int((e - s).sum())


def overlap_ns(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> int:
    """The time covered by both sets of intervals."""
    a_s, a_e = merge(*a)
    b_s, b_e = merge(*b)
    if not len(a_s) or not len(b_s):
        return 0
    # each merged interval of `a` against the merged intervals of `b` (disjoint and sorted)
    cum = np.concatenate([[0], np.cumsum(b_e - b_s)])

    def covered_before(t: np.ndarray) -> np.ndarray:
        """b's covered time in (-inf, t)."""
        i = np.searchsorted(b_e, t, side="left")  # intervals of b wholly before t: [0, i)
        partial = np.clip(t - b_s[np.minimum(i, len(b_s) - 1)], 0, None) * (i < len(b_s))
        return cum[i] + np.minimum(partial, (b_e - b_s)[np.minimum(i, len(b_s) - 1)])

    return int((covered_before(a_e) - covered_before(a_s)).sum())


def clip(start: np.ndarray, end: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """The parts of the intervals inside [lo, hi] (empty ones dropped)."""
    s, e = np.clip(start, lo, hi), np.clip(end, lo, hi)
    keep = e > s
    return s[keep], e[keep]
