"""Flows across backends: ids shifted only where they would collide, and flows left with one end (its
partner outside the window, or rejected) cleared."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from polyprof.model import FLOW_NONE
from polyprof.model.args import sorted_unique


def flow_offset(flow_id: np.ndarray, highest_so_far: int) -> tuple[int, int]:
    """(the shift for one backend's flow ids, the highest id in the trace after it). A single device
    backend keeps Kineto's convention (ac2g id = correlation id): ids are shifted only when they would
    collide with an earlier backend's."""
    ids = flow_id[flow_id != 0]
    if not len(ids):
        return 0, highest_so_far
    offset = 0 if int(ids.min()) > highest_so_far else highest_so_far
    return offset, int(ids.max()) + offset


def backend_flow_offsets(ids: Mapping[str, np.ndarray]) -> dict[str, int]:
    """Each backend's flow-id shift, from its flow ids (only their least and greatest count), taken in
    the order the backends come."""
    offsets, highest = {}, 0
    for backend, backend_ids in ids.items():
        offsets[backend], highest = flow_offset(backend_ids, highest)
    return offsets


def _member(values: np.ndarray, of_sorted: np.ndarray) -> np.ndarray:
    if not len(of_sorted):
        return np.zeros(len(values), dtype=bool)
    pos = np.minimum(np.searchsorted(of_sorted, values), len(of_sorted) - 1)
    return of_sorted[pos] == values


def clear_unpaired_flows(columns: dict[str, np.ndarray]) -> int:
    """Clear, in place, the flow of every row whose flow (id and type) lacks a start or an end.
    Returns how many rows lost their flow."""
    fid = columns["flow_id"]
    has = fid != 0
    if not has.any():
        return 0
    key = fid * 4 + columns["flow_type"].astype(np.int64)
    is_start = columns["flow_start"] != 0
    starts = sorted_unique(key[has & is_start])
    ends = sorted_unique(key[has & ~is_start])
    if len(starts) == len(ends) and np.array_equal(starts, ends):
        return 0  # the usual case: every flow has both ends
    lone = has & ~(_member(key, starts) & _member(key, ends))
    count = int(lone.sum())
    if count:
        fid[lone] = 0
        columns["flow_type"][lone] = FLOW_NONE
        columns["flow_start"][lone] = 0
    return count
