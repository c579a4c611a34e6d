"""The trace's one order — by start, longer first on equal starts (parents before children), then as
handed over — and placing added rows into it without sorting again."""

from __future__ import annotations

import numpy as np


def is_ordered(start: np.ndarray, end: np.ndarray) -> bool:
    if len(start) < 2:
        return True
    s0, s1 = start[:-1], start[1:]
    if not np.all(s1 >= s0):
        return False
    tie = s1 == s0
    return not np.any(tie & ((end[1:] - s1) > (end[:-1] - s0)))


def start_order(start: np.ndarray, end: np.ndarray) -> np.ndarray | None:
    """The permutation that orders rows by (start, -duration), stable; None when they already are.

    A stable sort on start (runs of already-ordered rows, as backends hand them over, make it fast),
    then only the groups of equal starts are reordered by duration.
    """
    if is_ordered(start, end):
        return None
    order = np.argsort(start, kind="stable")
    s = start[order]
    tie = s[1:] == s[:-1]
    if tie.any():
        in_tie = np.zeros(len(s), dtype=bool)
        in_tie[1:] |= tie
        in_tie[:-1] |= tie
        at = np.flatnonzero(in_tie)
        rows = order[at]
        order[at] = rows[np.lexsort((-(end[rows] - start[rows]), start[rows]))]
    return order


def rank_after_ties(
    keys: np.ndarray, durations: np.ndarray, key: np.ndarray, duration: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> np.ndarray:
    """For queries (key, duration) whose equal keys lie at ``[lo, hi)`` of the sorted `keys` (durations
    non-increasing there), the number of rows before each query: ``lo`` plus the rows of the group with a
    duration at least the query's. A vectorised binary search over the (usually tiny) groups."""
    lo, hi = lo.copy(), hi.copy()
    while True:
        open_ = lo < hi
        if not open_.any():
            return lo
        mid = (lo + hi) // 2
        take = open_ & (durations[np.minimum(mid, len(durations) - 1)] >= duration)
        lo = np.where(take, mid + 1, lo)
        hi = np.where(open_ & ~take, mid, hi)


def rank_in_order(keys: np.ndarray, durations: np.ndarray, q: np.ndarray, q_dur: np.ndarray) -> np.ndarray:
    """For each query (key, duration), how many rows of the (key, -duration)-ordered rows order before
    it or equal to it. A query tying with one row (the usual tie) is settled by one comparison; only
    queries tying with several rows search their group."""
    n = len(keys)
    pos = np.searchsorted(keys, q, "left")
    if not n:
        return pos
    at = np.minimum(pos, n - 1)
    tied = (pos < n) & (keys[at] == q)
    if not tied.any():
        return pos
    nxt = np.minimum(pos + 1, n - 1)
    several = tied & (pos + 1 < n) & (keys[nxt] == q)
    single = np.flatnonzero(tied & ~several)
    pos[single] += durations[pos[single]] >= q_dur[single]
    many = np.flatnonzero(several)
    if len(many):
        hi = np.searchsorted(keys, q[many], "right")
        pos[many] = rank_after_ties(keys, durations, q[many], q_dur[many], pos[many], hi)
    return pos


def insertion_points(start: np.ndarray, end: np.ndarray, add_start: np.ndarray, add_end: np.ndarray) -> np.ndarray:
    """Where rows (add_start, add_end), already in order themselves, go among ordered rows (start, end):
    after every row that orders before or equal to them (existing rows first on full ties)."""
    return rank_in_order(start, end - start, add_start, add_end - add_start)


def interleave(n_existing: int, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(final positions of the existing rows, final positions of the added rows) when the added rows go
    in at `points` (non-decreasing insertion points into the existing rows)."""
    added = points + np.arange(len(points), dtype=np.int64)
    before = np.cumsum(np.bincount(points, minlength=n_existing + 1)[:n_existing])  # added rows at or before
    return np.arange(n_existing, dtype=np.int64) + before, added
