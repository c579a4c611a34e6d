"""Kineto's ``gpu_user_annotation`` rows, for every device: for each host annotation, one span per
device row (stream, queue) from the first to the last device activity launched inside it.

A device activity belongs to the annotation its backend's External id names (the id as the backend
handed it over, before launch attribution refined it to an op); otherwise to the innermost annotation
open on the launching thread when its launch (the host end of its ac2g flow) started.
"""

from __future__ import annotations

import numpy as np

from polyprof.merge.attribution import ANNOTATION, Launches, in_order
from polyprof.merge.containment import innermost_open_span
from polyprof.merge.lookup import lookup
from polyprof.merge.order import start_order
from polyprof.model import FLOW_AC2G, ActivityKind

DEVICE_WORK = (int(ActivityKind.KERNEL), int(ActivityKind.GPU_MEMCPY), int(ActivityKind.GPU_MEMSET))
CATEGORY = "gpu_user_annotation"


def gpu_user_annotations(
    columns: dict[str, np.ndarray],
    order: np.ndarray,
    thread: np.ndarray,
    backend_ext: np.ndarray,
    launches: Launches,
) -> dict[str, np.ndarray] | None:
    """The added rows as columns in trace order (name codes are the annotations'), or None.
    `launches` is what launch attribution found (each launch's innermost open container)."""
    kind, flow = columns["kind"], columns["flow_id"]
    is_annotation = kind == ANNOTATION
    if not is_annotation.any():
        return None
    linked = (flow != 0) & (columns["flow_type"] == FLOW_AC2G)
    is_work = linked & (columns["flow_start"] == 0) & ((kind == DEVICE_WORK[0]) | (kind == DEVICE_WORK[1]) | (kind == DEVICE_WORK[2]))
    if not is_work.any():
        return None
    work = in_order(order, is_work)
    annotations = in_order(order, is_annotation)
    corr = columns["correlation"]
    # exact links first: device work whose backend External id names an annotation
    owner = lookup(corr[annotations], annotations, backend_ext[work])
    missing = np.flatnonzero(owner < 0)
    if len(missing):
        owner[missing] = _annotation_at_launch(columns, order, thread, annotations, launches, flow[work[missing]])
    keep = owner >= 0
    if not keep.any():
        return None
    work, owner = work[keep], owner[keep]
    device, resource = columns["device"][work], columns["resource"][work]
    # one span per (annotation, device row), in order of its first device activity
    key = owner * (int(resource.max()) + 1) + resource
    grouped = np.argsort(key, kind="stable")
    k = key[grouped]
    heads = np.flatnonzero(np.concatenate(([True], k[1:] != k[:-1])))
    starts = np.minimum.reduceat(columns["start"][work][grouped], heads)
    ends = np.maximum.reduceat(columns["end"][work][grouped], heads)
    first_seen = grouped[heads]  # positions in `work` (trace order) of each span's first activity
    by_first = np.argsort(first_seen, kind="stable")
    starts, ends, first = starts[by_first], ends[by_first], first_seen[by_first]
    again = start_order(starts, ends)
    if again is not None:
        starts, ends, first = starts[again], ends[again], first[again]
    span_owner, n = owner[first], len(starts)
    ids = corr[span_owner]
    return {
        "kind": np.full(n, int(ActivityKind.GPU_USER_ANNOTATION), dtype=kind.dtype),
        "cat": None,  # filled by the caller (interned in the trace's string table)
        "name": columns["name"][span_owner],
        "device": device[first],
        "resource": resource[first],
        "start": starts,
        "end": ends,
        "correlation": ids,
        "external_id": ids.copy(),
        "flow_id": np.zeros(n, dtype=np.int64),
        "flow_type": np.zeros(n, dtype=columns["flow_type"].dtype),
        "flow_start": np.zeros(n, dtype=columns["flow_start"].dtype),
    }


def _annotation_at_launch(
    columns: dict[str, np.ndarray],
    order: np.ndarray,
    thread: np.ndarray,
    annotations: np.ndarray,
    launches: Launches,
    flows: np.ndarray,
) -> np.ndarray:
    """For device work by its flow ids: the innermost annotation open at its flow's start (-1: none).
    Where launch attribution found an annotation innermost, that is it; where it found no container,
    there is none; the rest (an op innermost, or a flow starting at a row that is not a launch) ask the
    annotations."""
    kind, start, end = columns["kind"], columns["start"], columns["end"]
    flow_starts = in_order(order, (columns["flow_id"] != 0) & (columns["flow_type"] == FLOW_AC2G) & (columns["flow_start"] != 0))
    found = np.full(len(kind), -2, dtype=np.int64)  # per row: -2 = not known yet
    inner = launches.innermost
    direct = (inner < 0) | (kind[np.maximum(inner, 0)] == ANNOTATION)
    found[launches.rows[direct]] = inner[direct]
    ask = flow_starts[found[flow_starts] == -2]
    if len(ask):
        found[ask] = innermost_open_span(start, end, thread, annotations, ask)
    row = lookup(columns["flow_id"][flow_starts], flow_starts, flows)
    return np.where(row >= 0, found[np.maximum(row, 0)], -1)
