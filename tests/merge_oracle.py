"""The merge as it was before issue #13 (per-row Python loops), kept as the oracle the vectorised
merge is checked against (tests/merge/test_merge.py). Only the device table is shared with the new code."""

from __future__ import annotations

import numpy as np

from polyprof.merge.devices import DeviceTable
from polyprof.model import (
    FLOW_AC2G,
    FLOW_NONE,
    ActivityBuilder,
    ActivityKind,
    ActivityTable,
    CollectedPart,
    Counters,
    Trace,
)


def merge(
    parts: list[CollectedPart],
    *,
    window: tuple[int, int],
    epoch_offset_ns: int,
    base_time_ns: int,
    metadata: dict,
    kind_filters: dict[str, set[int]] | None = None,
    paused: dict[str, list[tuple[int, int]]] | None = None,
) -> Trace:
    """Build the trace. Rows whose start lies outside `window` are dropped (and counted per backend);
    a backend's flow ids are shifted only where they would collide with an earlier backend's (so a
    single device backend keeps Kineto's convention: ac2g id = correlation id); flows missing one end
    are cleared. `kind_filters` (backend name -> kinds kept) drops the other kinds of those backends'
    rows (counted as "activity filter"); `paused` (backend name -> [start, end) intervals) drops the
    rows that start in them (counted as "collection toggled off")."""
    table = DeviceTable()
    pieces = []
    counters = Counters()
    device_properties: list[dict] = []
    extra_metadata: dict = {}
    highest_flow_id = 0
    w0, w1 = window
    for part in parts:
        sink = part
        dev_map = table.device_map(sink.devices)
        res_map = table.resource_map(sink.resources, dev_map)
        acts = part.activities
        if len(acts):
            start = acts["start"]
            inside = (start >= w0) & (start <= w1)
            outside = int(len(acts) - inside.sum())
            if outside:
                part.status.dropped["outside capture window"] = outside
            kept = inside
            allowed = (kind_filters or {}).get(part.status.name)
            if allowed is not None:
                kept = inside & np.isin(acts["kind"], sorted(allowed))
                filtered = int(inside.sum() - kept.sum())
                if filtered:
                    part.status.dropped["activity filter"] = filtered
            for p0, p1 in (paused or {}).get(part.status.name, ()):
                off = kept & (start >= p0) & (start < p1)
                if off.any():
                    part.status.dropped["collection toggled off"] = (
                        part.status.dropped.get("collection toggled off", 0) + int(off.sum())
                    )
                    kept = kept & ~off
            if not kept.all():
                acts = acts.take(np.flatnonzero(kept))
            acts = _clip_host_ends(acts, dev_map, w1)
        part.status.activities = len(acts)
        flow_offset, highest_flow_id = _flow_offset(acts, highest_flow_id)
        pieces.append((acts, dev_map if len(dev_map) else np.zeros(0, np.int32), res_map, flow_offset))
        for s in sink.counters.samples:
            if w0 <= s.ts <= w1:
                counters.add(
                    s.name,
                    int(dev_map[s.device]),
                    s.ts,
                    s.value,
                    int(res_map[s.resource]) if s.resource >= 0 else -1,
                )
        for props in sink.device_properties:
            if props not in device_properties:
                device_properties.append(props)
        extra_metadata.update(sink.metadata)
    activities = ActivityTable.concat(pieces)
    activities = _sorted(_clear_unpaired_flows(activities))
    activities = attribute_launches_by_containment(activities)
    activities = add_gpu_user_annotations(activities)
    statuses = {p.status.name: p.status for p in parts}
    meta = {"host_name": "oracle", **extra_metadata, **metadata}
    return Trace(
        activities=activities,
        devices=table.devices,
        resources=table.resources,
        counters=counters,
        metadata=meta,
        device_properties=device_properties,
        backends=statuses,
        epoch_offset_ns=epoch_offset_ns,
        base_time_ns=base_time_ns,
        window=window,
    )


def _clip_host_ends(acts: ActivityTable, dev_map: np.ndarray, window_end: int) -> ActivityTable:
    """Host rows still running when the window closed (the Python frames of the stop itself, as torch's
    collector reports them) end with the window, as Kineto writes unfinished CPU work. Device work
    keeps its own end: kernels in flight at stop finish after it."""
    if not len(acts) or not len(dev_map):
        return acts
    late = (dev_map[acts["device"]] == 0) & (acts["end"] > window_end)
    if not late.any():
        return acts
    cols = dict(acts.columns)
    cols["end"] = np.where(late, window_end, acts["end"])
    return ActivityTable(acts.strings, cols, acts.args)


def _clear_unpaired_flows(acts: ActivityTable) -> ActivityTable:
    """A flow with only one end left (its partner was outside the window or rejected) is removed."""
    if not len(acts):
        return acts
    fid = acts["flow_id"]
    has = fid != 0
    if not has.any():
        return acts
    key = fid.astype(np.int64) * 4 + acts["flow_type"].astype(np.int64)
    starts = set(key[has & (acts["flow_start"] == 1)].tolist())
    ends = set(key[has & (acts["flow_start"] == 0)].tolist())
    paired = np.fromiter(((k in starts and k in ends) for k in key.tolist()), dtype=bool, count=len(key))
    lone = has & ~paired
    if lone.any():
        cols = dict(acts.columns)
        cols["flow_id"] = np.where(lone, 0, fid)
        cols["flow_type"] = np.where(lone, FLOW_NONE, acts["flow_type"]).astype(np.int8)
        cols["flow_start"] = np.where(lone, 0, acts["flow_start"]).astype(np.int8)
        acts = ActivityTable(acts.strings, cols, acts.args)
    return acts


def _sorted(acts: ActivityTable) -> ActivityTable:
    """Rows by start time (ties: longer first, so parents precede children)."""
    if len(acts) < 2:
        return acts
    start, end = acts["start"], acts["end"]
    if np.all(start[1:] >= start[:-1]) and not np.any((start[1:] == start[:-1]) & (end[1:] > end[:-1])):
        return acts
    order = np.lexsort((-(end - start), start))
    return acts.take(order)


_CONTAINERS = (int(ActivityKind.CPU_OP), int(ActivityKind.USER_ANNOTATION))
_LAUNCHES = (int(ActivityKind.RUNTIME), int(ActivityKind.DRIVER))


def innermost_open_span(acts: ActivityTable, spans: np.ndarray, calls: np.ndarray) -> dict[int, int]:
    """For each row in `calls`, the row in `spans` that is the innermost span open on the same thread
    (device and resource) when the call started. Spans' ends may end before the call's does."""
    rows = np.concatenate([spans, calls])
    if not len(spans) or not len(calls):
        return {}
    start_a, end_a = acts["start"], acts["end"]
    thread_key = acts["device"][rows].astype(np.int64) * (1 << 32) + acts["resource"][rows]
    order = rows[np.lexsort((-(end_a[rows] - start_a[rows]), start_a[rows], thread_key))]
    is_span = np.zeros(len(acts), dtype=bool)
    is_span[spans] = True
    start, end = start_a.tolist(), end_a.tolist()
    dev, res = acts["device"].tolist(), acts["resource"].tolist()
    found: dict[int, int] = {}
    stack: list[int] = []
    current = None
    for i in order.tolist():
        key = (dev[i], res[i])
        if key != current:
            stack, current = [], key
        while stack and end[stack[-1]] < start[i]:
            stack.pop()
        if is_span[i]:
            stack.append(i)
        elif stack:
            found[i] = stack[-1]
    return found


def _flow_offset(acts: ActivityTable, highest_so_far: int) -> tuple[int, int]:
    """(the shift for this backend's flow ids, the highest id in the trace after it)."""
    ids = acts["flow_id"][acts["flow_id"] != 0] if len(acts) else np.zeros(0, np.int64)
    if not len(ids):
        return 0, highest_so_far
    offset = 0 if int(ids.min()) > highest_so_far else highest_so_far
    return offset, int(ids.max()) + offset


def attribute_launches_by_containment(acts: ActivityTable) -> ActivityTable:
    """Give each runtime/driver call the id of the innermost host op or annotation open on its thread
    when it started, and pass that id to the device work its ac2g flow leads to.

    This is how framework ops whose ids cannot be pushed to a backend (torch's aten ops have no Python
    hook per op) still become the `External id` of the kernels they launched. It agrees with push/pop
    attribution wherever both apply: the innermost open span is the one push/pop would have named.
    """
    n = len(acts)
    if not n:
        return acts
    kind = acts["kind"]
    is_container, is_launch = np.isin(kind, _CONTAINERS), np.isin(kind, _LAUNCHES)
    if not np.any(is_container) or not np.any(is_launch):
        return acts
    corr = acts["correlation"]
    containers = np.flatnonzero(is_container & (corr != 0))
    launches = np.flatnonzero(is_launch)
    new_ext = acts["external_id"].copy()
    changed: dict[int, int] = {}  # launch row -> external id
    for launch, span in innermost_open_span(acts, containers, launches).items():
        ext = int(corr[span])
        if new_ext[launch] != ext:
            new_ext[launch] = ext
            changed[launch] = ext
    if not changed:
        return acts
    flow = acts["flow_id"]
    rows = np.array(list(changed), dtype=np.int64)
    launch_flow = {
        int(f): changed[int(r)] for r, f in zip(rows.tolist(), flow[rows].tolist(), strict=True) if f
    }
    if launch_flow:
        targets = np.flatnonzero((flow != 0) & (acts["flow_start"] == 0) & (acts["flow_type"] == FLOW_AC2G))
        for t in targets.tolist():
            ext = launch_flow.get(int(flow[t]))
            if ext is not None:
                new_ext[t] = ext
    cols = dict(acts.columns)
    cols["external_id"] = new_ext
    return ActivityTable(acts.strings, cols, acts.args)


_DEVICE_WORK = (int(ActivityKind.KERNEL), int(ActivityKind.GPU_MEMCPY), int(ActivityKind.GPU_MEMSET))


def add_gpu_user_annotations(acts: ActivityTable) -> ActivityTable:
    """Kineto's `gpu_user_annotation` rows, for every device: for each host annotation, one span per
    device row (stream, queue) from the first to the last device activity launched inside it.

    A device activity belongs to the annotation its External id names, when a backend linked it through
    vendor external correlation; otherwise to the innermost annotation open on the launching thread when
    its launch (the host end of its ac2g flow) started.
    """
    if not len(acts):
        return acts
    kind, flow, ftype, fstart = acts["kind"], acts["flow_id"], acts["flow_type"], acts["flow_start"]
    annotation = int(ActivityKind.USER_ANNOTATION)
    if not np.any(kind == annotation) or not np.any(flow != 0):
        return acts
    linked = (flow != 0) & (ftype == FLOW_AC2G)
    launches = np.flatnonzero(linked & (fstart == 1))
    work = np.flatnonzero(linked & (fstart == 0) & np.isin(kind, _DEVICE_WORK))
    if not len(launches) or not len(work):
        return acts
    start, end = acts["start"].tolist(), acts["end"].tolist()
    dev, res = acts["device"].tolist(), acts["resource"].tolist()
    enclosing = innermost_open_span(acts, np.flatnonzero(kind == annotation), launches)
    annotation_of_flow = {int(flow[i]): a for i, a in enclosing.items()}
    # exact links first: device work whose External id names an annotation (vendor external correlation)
    by_id = {
        int(c): int(i)
        for i, c in zip(
            np.flatnonzero(kind == annotation).tolist(),
            acts["correlation"][kind == annotation].tolist(),
            strict=True,
        )
        if c
    }
    external = acts["external_id"]
    spans: dict[tuple[int, int, int], list[int]] = {}
    for w in work.tolist():
        a = by_id.get(int(external[w]))
        if a is None:
            a = annotation_of_flow.get(int(flow[w]))
        if a is None:
            continue
        key = (a, dev[w], res[w])
        span = spans.get(key)
        if span is None:
            spans[key] = [start[w], end[w]]
        else:
            span[0] = min(span[0], start[w])
            span[1] = max(span[1], end[w])
    if not spans:
        return acts
    builder = ActivityBuilder(acts.strings)
    names, corr = acts["name"], acts["correlation"]
    for (a, d, r), (s, e) in spans.items():
        builder.append(
            ActivityKind.GPU_USER_ANNOTATION,
            "gpu_user_annotation",
            acts.strings[int(names[a])],
            d,
            r,
            s,
            e,
            int(corr[a]),
            int(corr[a]),
        )
    extra = builder.freeze()
    identity_dev = np.arange(int(max(acts["device"].max(), extra["device"].max())) + 1, dtype=np.int32)
    identity_res = np.arange(int(max(acts["resource"].max(), extra["resource"].max())) + 1, dtype=np.int32)
    merged = ActivityTable.concat(
        [(acts, identity_dev, identity_res, 0), (extra, identity_dev, identity_res, 0)]
    )
    return _sorted(merged)
