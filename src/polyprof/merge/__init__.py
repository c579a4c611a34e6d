"""Merging what every backend handed over into one trace: a short pipeline of named, vectorised passes
over the sealed parts' columns, with one concatenation and one ordering::

    trace = merge(parts, window=(w0, w1), epoch_offset_ns=..., base_time_ns=..., metadata={...})

1. **select** (per part): rows outside the capture window, of filtered-out kinds, or recorded while
   collection was toggled off are dropped and counted in the merge's :class:`MergeReport`;
2. **concatenate** every part's kept rows into the trace's columns (device, resource and string
   handles mapped onto the trace's, flow ids shifted where two backends' would collide); host rows
   still running at the window's end end with it;
3. **order** once: by start, longer first (parents before children);
4. **flows**: a flow missing one end is cleared;
5. **launch attribution** (:mod:`.attribution`): the backend's External id stands; containment fills
   launches without one and refines to the synchronous op open at the launch;
6. **device-side annotations** (:mod:`.gpu_annotations`): rows added, placed into the order without
   sorting again.

The merge is a function of the sealed parts: it writes nothing into them or their statuses. What it
did to each backend's rows (dropped by reason, kept) is its :class:`MergeReport`, folded once into the
trace's snapshot of each backend's status.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from polyprof import _native
from polyprof.merge.attribution import attribute_launches
from polyprof.merge.devices import DeviceTable, host_process_name
from polyprof.merge.flows import backend_flow_offsets, clear_unpaired_flows
from polyprof.merge.gpu_annotations import CATEGORY as GPU_ANNOTATION_CATEGORY
from polyprof.merge.gpu_annotations import gpu_user_annotations
from polyprof.merge.limits import DROP_REASONS, Limits, cap_per_backend
from polyprof.merge.memory import release_when_collected
from polyprof.merge.order import insertion_points, interleave, start_order
from polyprof.model import (
    COLUMNS,
    ActivityTable,
    Args,
    BackendStatus,
    CollectedPart,
    Counters,
    StringTable,
    Trace,
)
from polyprof.plugin.clock import JOB_BASE_KEY
from polyprof.plugin.clock import base_time_ns as clock_base_time_ns

__all__ = ["DeviceTable", "MergeContext", "MergeReport", "host_process_name", "merge"]

OUTSIDE_WINDOW = "outside capture window"
FILTERED = "activity filter"
TOGGLED_OFF = "collection toggled off"
#: dropped-row reasons that are the user's choice, not a backend's problem
RING = "older than the ring (ring_s)"
RING_MB = "over the ring's megabytes (ring_mb)"
CHOSEN_DROPS = (OUTSIDE_WINDOW, FILTERED, TOGGLED_OFF, RING, RING_MB, *DROP_REASONS)


def chosen_drop(what: str) -> bool:
    """Whether rows were dropped because the user asked for it (not worth a warning)."""
    from polyprof.plugin.backend import BY_OPTION

    return what in CHOSEN_DROPS or what.startswith(BY_OPTION)


@dataclass
class MergeReport:
    """What a merge did to each backend's rows: dropped ones by reason, and how many it kept."""

    dropped: dict[str, dict[str, int]] = field(default_factory=dict)
    kept: dict[str, int] = field(default_factory=dict)

    def drop(self, backend: str, reason: str, count: int) -> None:
        if count:
            mine = self.dropped.setdefault(backend, {})
            mine[reason] = mine.get(reason, 0) + int(count)

    def folded_into(self, statuses: dict[str, BackendStatus]) -> dict[str, BackendStatus]:
        """Each status as it is now (a snapshot, which later rows leave alone) with this report added:
        the one count that a trace, its summary and its file all show."""
        out = {}
        for name, status in statuses.items():
            snap = status.snapshot()
            for reason, count in self.dropped.get(name, {}).items():
                snap.add_dropped(reason, count)
            snap.activities = self.kept.get(name, 0)
            out[name] = snap
        return out


@dataclass
class MergeContext:
    """What a trace's parts say of it besides their rows: the devices and rows their handles map onto,
    the device properties and metadata they carry, each backend's status (its last part's)."""

    devices: DeviceTable
    maps: list[tuple[np.ndarray, np.ndarray]]  # the parts' (device map, resource map), in their order
    device_properties: list[dict]
    metadata: dict
    statuses: dict[str, BackendStatus]

    @classmethod
    def of(cls, parts: Sequence[CollectedPart]) -> MergeContext:
        context = cls(DeviceTable(), [], [], {}, {})
        context.maps = context.maps_of(parts)
        for part in parts:
            for props in part.device_properties:
                if props not in context.device_properties:
                    context.device_properties.append(props)
            context.metadata.update(part.metadata)
            context.statuses[part.backend] = part.status
        return context

    def maps_of(self, parts: Sequence[CollectedPart]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each part's (device map, resource map) onto the trace's devices and rows (a part of the
        context's maps onto those it added)."""
        maps = []
        for part in parts:
            dev_map = self.devices.device_map(part.devices)
            maps.append((dev_map, self.devices.resource_map(part.resources, dev_map)))
        return maps


def _select(
    part: CollectedPart,
    window: tuple[int, int],
    kinds: set[int] | None,
    paused: Sequence[tuple[int, int]],
    report: MergeReport,
    limits: Limits | None = None,
) -> np.ndarray | None:
    """The rows of `part` to keep (None: all), counting the others in `report`."""
    acts = part.activities
    if not len(acts):
        return None
    start = acts["start"]
    w0, w1 = window
    kept = (start >= w0) & (start <= w1)
    report.drop(part.backend, OUTSIDE_WINDOW, int(len(acts) - kept.sum()))
    if kinds is not None:
        allowed = kept & np.isin(acts["kind"], sorted(kinds))
        report.drop(part.backend, FILTERED, int(kept.sum() - allowed.sum()))
        kept = allowed
    for p0, p1 in paused:
        off = kept & (start >= p0) & (start < p1)
        if off.any():
            report.drop(part.backend, TOGGLED_OFF, int(off.sum()))
            kept &= ~off
    if limits is not None:
        kept = limits.keep(part, kept, report)
    return None if kept.all() else np.flatnonzero(kept)


def _flow_offsets(parts: Sequence[CollectedPart], keeps: Sequence[np.ndarray | None]) -> list[int]:
    """Each part's flow-id shift: one per backend (a launch handed over by one flush and its kernel by
    the next must stay paired), taken in the order the backends come."""
    by_backend: dict[str, list[np.ndarray]] = {}
    for part, keep in zip(parts, keeps, strict=True):
        fid = part.activities["flow_id"] if len(part.activities) else np.zeros(0, np.int64)
        by_backend.setdefault(part.backend, []).append(fid if keep is None else fid[keep])
    offsets = backend_flow_offsets({backend: np.concatenate(ids) for backend, ids in by_backend.items()})
    return [offsets[p.backend] for p in parts]


def _concatenate(
    parts: Sequence[CollectedPart],
    keeps: Sequence[np.ndarray | None],
    maps: Sequence[tuple[np.ndarray, np.ndarray]],
    report: MergeReport,
    flow_offsets: Mapping[str, int] | None = None,
) -> tuple[ActivityTable, np.ndarray]:
    """One table of every part's kept rows (handles mapped, flow ids de-collided: by `flow_offsets`
    where given, else from these parts), and a per-row mask of the rows whose backends' spans follow
    the context."""
    sizes = [len(p.activities) if k is None else len(k) for p, k in zip(parts, keeps, strict=True)]
    total = sum(sizes)
    strings = StringTable()
    columns = {name: np.empty(total, dtype=dtype) for name, dtype in COLUMNS}
    context_scoped = np.zeros(total, dtype=bool)
    args: list[Args] = []
    base = 0
    offsets = _flow_offsets(parts, keeps) if flow_offsets is None else [flow_offsets[p.backend] for p in parts]
    for part, keep, (dev_map, res_map), n, offset in zip(parts, keeps, maps, sizes, offsets, strict=True):
        report.kept[part.backend] = report.kept.get(part.backend, 0) + n
        if not n:
            continue
        acts = part.activities
        string_map = np.array([strings.intern(s) for s in acts.strings.strings] or [0], dtype=np.int32)
        out = slice(base, base + n)
        remap = {"cat": string_map, "name": string_map, "device": dev_map, "resource": res_map}
        for name, _ in COLUMNS:
            target = columns[name][out]
            mapping = remap.get(name)
            if mapping is not None and np.array_equal(mapping, np.arange(len(mapping))):
                mapping = None  # handles already the trace's: a plain copy
            if mapping is None:
                if keep is None:
                    target[:] = acts.columns[name]
                else:
                    np.take(acts.columns[name], keep, out=target)
            else:
                np.take(mapping, acts.columns[name] if keep is None else acts.columns[name][keep], out=target)
        if offset:
            fid = columns["flow_id"][out]
            fid[fid != 0] += offset
        if part.context_scoped:
            context_scoped[out] = True
        if acts.args:
            args.append((acts.args if keep is None else acts.args.take(keep)).shifted(base))
        base += n
    return ActivityTable(strings, columns, Args.combine(args)), context_scoped


def _clip_host_ends(columns: dict[str, np.ndarray], window_end: int) -> None:
    """Host rows still running when the window closed (the Python frames of the stop itself, as torch's
    collector reports them) end with the window, as Kineto writes unfinished CPU work. Device work
    keeps its own end: kernels in flight at stop finish after it."""
    late = (columns["device"] == 0) & (columns["end"] > window_end)
    if late.any():
        columns["end"][late] = window_end


def _place(table: ActivityTable, order: np.ndarray | None, added: dict[str, np.ndarray] | None) -> ActivityTable:
    """The final table: `table`'s rows in `order`, with the `added` rows (in order themselves) placed
    among them. Each column is written once; `table` is consumed (its columns are taken from it)."""
    cols, args = table.columns, table.args
    if added is None:
        if order is None:
            return table
        return ActivityTable(table.strings, {k: v[order] for k, v in cols.items()}, args.take(order) if args else args)
    start = cols["start"] if order is None else cols["start"][order]
    end = cols["end"] if order is None else cols["end"][order]
    existing_at, added_at = _positions(start, end, added["start"], added["end"])
    n_added = len(added["start"])
    # one gather per column from [existing rows, added rows]: where each final row comes from
    source = np.empty(len(start) + n_added, dtype=np.int64)
    source[existing_at] = np.arange(len(start)) if order is None else order
    source[added_at] = len(start) + np.arange(n_added)
    # each column of `table` is dropped once placed: the next one's output reuses its (already mapped) memory
    out = {name: _take_two(cols.pop(name), added[name].astype(dtype, copy=False), source) for name, dtype in COLUMNS}
    if args:
        args = (args if order is None else args.take(order)).renumbered(existing_at)
    return ActivityTable(table.strings, out, args)


def _positions(start: np.ndarray, end: np.ndarray, add_start: np.ndarray, add_end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Final positions of ordered rows and of the (ordered) rows added among them (see order.interleave)."""
    placed = _native.interleave_ordered(start, end, add_start, add_end)
    return interleave(len(start), insertion_points(start, end, add_start, add_end)) if placed is None else placed


def _take_two(first: np.ndarray, second: np.ndarray, source: np.ndarray) -> np.ndarray:
    """``np.concatenate((first, second)).take(source)``, without writing the concatenation where the C
    extension takes it."""
    out = _native.take_two(first, second, source)
    return np.concatenate((first, second)).take(source) if out is None else out


def _counters(
    parts: Sequence[CollectedPart], maps: Sequence[tuple[np.ndarray, np.ndarray]], window: tuple[int, int]
) -> Counters:
    strings = StringTable()
    chunks: list[dict[str, np.ndarray]] = []
    for part, (dev_map, res_map) in zip(parts, maps, strict=True):
        c = part.counters.columns
        if not len(c["ts"]):
            continue
        inside = (c["ts"] >= window[0]) & (c["ts"] <= window[1])
        if not inside.any():
            continue
        names = np.array([strings.intern(s) for s in part.counters.strings.strings], dtype=np.int32)
        resource = c["resource"][inside]
        chunks.append(
            {
                "name": names[c["name"][inside]],
                "device": dev_map[c["device"][inside]],
                "resource": np.where(resource >= 0, res_map[np.maximum(resource, 0)] if len(res_map) else -1, -1),
                "ts": c["ts"][inside],
                "value": c["value"][inside],
            }
        )
    if not chunks:
        return Counters(strings)
    return Counters.from_columns(strings, {k: np.concatenate([ch[k] for ch in chunks]) for k in chunks[0]})


def _base_time(start_epoch_ns: int, statuses) -> int:
    """The trace's base: the job's, where a backend's clock measurement carries it (JOB_BASE_KEY)."""
    agreed = [m[JOB_BASE_KEY] for st in statuses for m in st.clock.values() if isinstance(m.get(JOB_BASE_KEY), int)]
    return clock_base_time_ns(start_epoch_ns, min(agreed) if agreed else None)


def merge(
    parts: Sequence[CollectedPart],
    *,
    window: tuple[int, int],
    epoch_offset_ns: int,
    base_time_ns: int | None = None,
    metadata: dict,
    kind_filters: dict[str, set[int]] | None = None,
    paused: dict[str, list[tuple[int, int]]] | None = None,
    limits: Limits | None = None,
    report: MergeReport | None = None,
    flow_offsets: Mapping[str, int] | None = None,
    context: MergeContext | None = None,
) -> Trace:
    """Build the trace (see the module docstring). `kind_filters` (backend name -> kinds kept) and
    `paused` (backend name -> [start, end) intervals) drop rows as the user asked, counted per backend.
    Several parts of one backend (its flushes and its collect) share one status. Without
    `base_time_ns`, the trace's base is the job's where a backend recorded one, else the window's day
    (:func:`polyprof.plugin.clock.base_time_ns`).

    A trace merged piece by piece (:mod:`polyprof.formats.spill.recover_stream`: each piece the parts' rows of
    one span of time) passes one `report` to every piece, so that the last piece's statuses count every
    piece's rows; every backend's `flow_offsets` (:func:`.flows.backend_flow_offsets` of all its
    rows), so that each piece's flow ids are the whole trace's; and the `context` of all the parts
    (:meth:`MergeContext.of`), so that each piece has the whole trace's devices, rows and statuses while
    it is given only the parts with rows in it."""
    took: dict[str, float] = {}
    clock = _PassClock(took)
    if context is None:
        context = MergeContext.of(parts)
        maps = context.maps
    else:
        maps = context.maps_of(parts)
    devices = context.devices
    report = MergeReport() if report is None else report
    keeps = [
        _select(part, window, (kind_filters or {}).get(part.backend), (paused or {}).get(part.backend, ()), report,
                limits)
        for part in parts
    ]
    if limits is not None and limits.max_events_per_backend is not None:
        cap_per_backend(parts, keeps, limits.max_events_per_backend, report)
    clock("select")
    table, context_scoped = _concatenate(parts, keeps, maps, report, flow_offsets)
    clock("concatenate")
    order, added = _order_and_link(table, window[1], context_scoped, clock)
    activities = _place(table, order, added)
    clock("place")
    counters = _counters(parts, maps, window)
    extra_metadata, device_properties = context.metadata, context.device_properties
    statuses = report.folded_into(context.statuses)  # counted once: later rows do not move it
    trace = Trace(
        activities=activities,
        devices=devices.devices,
        resources=devices.resources,
        counters=counters,
        metadata={"host_name": socket.gethostname(), **extra_metadata, **metadata},
        device_properties=device_properties,
        backends=statuses,
        epoch_offset_ns=epoch_offset_ns,
        base_time_ns=_base_time(window[0] + epoch_offset_ns, statuses.values()) if base_time_ns is None else base_time_ns,
        window=window,
        timings_ms={"merge_passes": took},
    )
    release_when_collected(trace, len(activities))  # a large one: what it and the merge freed goes back
    return trace


def _order_and_link(table: ActivityTable, window_end: int, context_scoped: np.ndarray, clock: _PassClock,
                    ) -> tuple[np.ndarray | None, dict[str, np.ndarray] | None]:
    """The rows' start order (None when already in order) and the GPU annotations their launches add:
    host ends clipped to the window, unpaired flows cleared, launches attributed to their host ops."""
    if not len(table):
        return None, None
    cols = table.columns
    _clip_host_ends(cols, window_end)
    order = start_order(cols["start"], cols["end"])
    in_order = np.arange(len(table), dtype=np.int64) if order is None else order
    clock("order")
    clear_unpaired_flows(cols)
    clock("flows")
    backend_ext = cols["external_id"].copy()
    thread = cols["resource"]  # a trace resource is one (device, row) pair: its index is a thread code
    launches = attribute_launches(cols, in_order, thread, context_scoped)
    clock("attribution")
    added = gpu_user_annotations(cols, in_order, thread, backend_ext, launches)
    if added is not None:
        added["cat"] = np.full(len(added["start"]), table.strings.intern(GPU_ANNOTATION_CATEGORY), dtype=np.int32)
    clock("gpu_annotations")
    return order, added


class _PassClock:
    """Milliseconds of each merge pass, for the trace's ``postprocess_ms`` (where a slow merge went)."""

    def __init__(self, took: dict[str, float]) -> None:
        self.took, self.last = took, time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.took[name] = round((now - self.last) * 1e3, 3)
        self.last = now
