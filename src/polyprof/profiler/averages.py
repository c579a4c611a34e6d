"""``key_averages()`` without torch: per-operator statistics of a trace, and the table torch.profiler
prints.

When torch is imported, ``polyprof.profiler.profile`` hands the trace to torch's own post-processing
(:mod:`polyprof.profiler.torch_view`), so the table is torch's, column for column. Without torch,
:class:`KeyAverages` computes the same statistics and prints the same headers.

Self time is an event's time minus its direct children's on the same thread; device time is the time
of the device work whose ``External id`` is the event's id (kernels, copies, fills), summed up the tree.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polyprof.model import DEVICE_KINDS, ActivityKind, Trace

HOST_KINDS = (int(ActivityKind.CPU_OP), int(ActivityKind.USER_ANNOTATION))
#: Utility ops torch.profiler leaves out of its tables (torch.autograd.profiler_util._filter_name).
UTILITY_NAMES = frozenset(
    {
        "[memory]",
        "[OutOfMemory]",
        "profiler::_record_function_enter",
        "profiler::_record_function_enter_new",
        "profiler::_record_function_exit",
        "aten::is_leaf",
        "aten::output_nr",
        "aten::_version",
    }
)
SORT_ALIASES = (("cuda", "device"), ("xpu", "device"), ("privateuse1", "device"))


@dataclass
class HostEvent:
    """One host op or annotation with its tree and its device time (times in µs, like torch)."""

    id: int
    name: str
    thread: int
    start_us: float
    end_us: float
    input_shapes: list | None = None
    stack: list[str] = field(default_factory=list)
    flops: int = 0
    kernels: list[tuple[str, int, float]] = field(default_factory=list)  # (name, device, duration us)
    children: list[HostEvent] = field(default_factory=list)
    parent: HostEvent | None = None

    @property
    def cpu_time_total(self) -> float:
        return self.end_us - self.start_us

    @property
    def self_cpu_time_total(self) -> float:
        return self.cpu_time_total - sum(c.cpu_time_total for c in self.children)

    @property
    def self_device_time_total(self) -> float:
        return sum(d for _, _, d in self.kernels)

    @property
    def device_time_total(self) -> float:
        return self.self_device_time_total + sum(c.device_time_total for c in self.children)


def host_events(trace: Trace) -> tuple[list[HostEvent], str | None]:
    """The host ops/annotations of `trace` with parents, children and kernels; and the device type name
    (``"cuda"``, ``"opencl"``, ...) of the device work found, if any."""
    acts = trace.activities
    if not len(acts):
        return [], None
    kind = acts["kind"]
    offset = trace.epoch_offset_ns - trace.base_time_ns
    host_rows = np.flatnonzero(np.isin(kind, HOST_KINDS))
    events: dict[int, HostEvent] = {}
    ordered: list[HostEvent] = []
    for i in host_rows.tolist():
        a = acts.row(i)
        if a.name in UTILITY_NAMES:
            continue
        tid = trace.resources[a.resource].id if 0 <= a.resource < len(trace.resources) else 0
        ev = HostEvent(
            id=a.correlation or -(i + 1),
            name=a.name,
            thread=tid,
            start_us=(a.start + offset) / 1000.0,
            end_us=(a.end + offset) / 1000.0,
            input_shapes=a.args.get("Input Dims"),
            stack=[s for s in str(a.args.get("Call stack", "")).split(";") if s],
            flops=int(a.args.get("flops", 0) or 0),
        )
        ordered.append(ev)
        if a.correlation:
            events[a.correlation] = ev
    device_type = None
    work_kinds = [int(k) for k in DEVICE_KINDS if k != ActivityKind.GPU_USER_ANNOTATION]  # spans, not work
    device_rows = np.flatnonzero(np.isin(kind, work_kinds) & (acts["external_id"] != 0))
    for i in device_rows.tolist():
        a = acts.row(i)
        owner = events.get(a.external_id)
        if owner is None:
            continue
        dev = trace.devices[a.device]
        device_type = device_type or dev.type
        owner.kernels.append((a.name, dev.index, a.duration / 1000.0))
    _build_tree(ordered)
    return _remove_duplicate_nodes(ordered), device_type


def _build_tree(events: list[HostEvent]) -> None:
    by_thread: dict[int, list[HostEvent]] = {}
    for ev in events:
        by_thread.setdefault(ev.thread, []).append(ev)
    for evs in by_thread.values():
        evs.sort(key=lambda e: (e.start_us, -e.end_us))
        stack: list[HostEvent] = []
        for ev in evs:
            while stack and stack[-1].end_us <= ev.start_us:
                stack.pop()
            if stack and ev.end_us <= stack[-1].end_us:
                ev.parent = stack[-1]
                stack[-1].children.append(ev)
            stack.append(ev)


def _remove_duplicate_nodes(events: list[HostEvent]) -> list[HostEvent]:
    """Drop an event that is the only child of a parent with the same name (the dispatcher's nested
    `aten::mean` inside `aten::mean`), lifting its children and device work, as torch's EventList
    does for its tables."""
    removed: set[int] = set()
    for ev in events:
        parent = ev.parent
        while parent is not None and id(parent) in removed:
            parent = parent.parent
        if (
            parent is not None
            and parent.name == ev.name
            and len(parent.children) == 1
            and parent.children[0] is ev
        ):
            parent.children = ev.children
            parent.kernels.extend(ev.kernels)
            for child in ev.children:
                child.parent = parent
            removed.add(id(ev))
    return [ev for ev in events if id(ev) not in removed]


@dataclass
class KeyAverage:
    """Aggregate of the events sharing a key (torch's FunctionEventAvg, in µs)."""

    key: str
    count: int = 0
    cpu_time_total: float = 0.0
    self_cpu_time_total: float = 0.0
    device_time_total: float = 0.0
    self_device_time_total: float = 0.0
    input_shapes: Any = None
    stack: list[str] = field(default_factory=list)
    flops: int = 0
    top_level: bool = True  # whether the group's first event has no parent (torch's cpu_parent is None)

    @property
    def cpu_time(self) -> float:
        return self.cpu_time_total / max(self.count, 1)

    @property
    def device_time(self) -> float:
        return self.device_time_total / max(self.count, 1)

    def __getattr__(self, name: str) -> Any:
        for old, new in SORT_ALIASES:  # self_cuda_time_total -> self_device_time_total, ...
            if old in name:
                return getattr(self, name.replace(old, new))
        raise AttributeError(name)


class KeyAverages(list):
    """A list of :class:`KeyAverage` with torch's ``table()``."""

    def __init__(self, items: Iterable[KeyAverage], device_type: str | None) -> None:
        super().__init__(items)
        self.device_type = device_type

    def table(
        self,
        sort_by: str | None = None,
        row_limit: int = 100,
        max_name_column_width: int = 55,
        header: str | None = None,
        top_level_events_only: bool = False,
        **_: Any,
    ) -> str:
        rows = self._chosen(sort_by, row_limit, top_level_events_only)
        dev = (self.device_type or "device").upper()
        has_device = any(r.self_device_time_total > 0 for r in self)
        has_shapes = any(r.input_shapes for r in self)
        headers = ["Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg"]
        if has_device:
            headers += [f"Self {dev}", f"Self {dev} %", f"{dev} total", f"{dev} time avg"]
        headers.append("# of Calls")
        if has_shapes:
            headers.append("Input Shapes")
        total_self_cpu = sum(r.self_cpu_time_total for r in self) or 1.0
        total_self_dev = sum(r.self_device_time_total for r in self) or 1.0
        table_rows = []
        for r in rows:
            name = (
                r.key
                if len(r.key) <= max_name_column_width - 4
                else r.key[: max_name_column_width - 7] + "..."
            )
            cells = [
                name,
                _share(r.self_cpu_time_total, total_self_cpu),
                _time(r.self_cpu_time_total),
                _share(r.cpu_time_total, total_self_cpu),
                _time(r.cpu_time_total),
                _time(r.cpu_time),
            ]
            if has_device:
                cells += [
                    _time(r.self_device_time_total),
                    _share(r.self_device_time_total, total_self_dev),
                    _time(r.device_time_total),
                    _time(r.device_time),
                ]
            cells.append(str(r.count))
            if has_shapes:
                cells.append(str(r.input_shapes or []))
            table_rows.append(cells)
        totals = [f"Self CPU time total: {_time(total_self_cpu if any(self) else 0)}"]
        if has_device:
            totals.append(f"Self {dev} time total: {_time(total_self_dev)}")
        return _laid_out(headers, table_rows, header, totals)

    def _chosen(self, sort_by: str | None, row_limit: int, top_level_events_only: bool) -> list:
        """The rows the table shows: sorted by `sort_by` (torch's names or their device aliases), top level
        only when asked, at most `row_limit` (all when it is not positive)."""
        rows = list(self)
        if sort_by is not None:
            attr = sort_by
            for old, new in SORT_ALIASES:
                attr = attr.replace(old, new)
            rows.sort(key=lambda r: getattr(r, attr), reverse=True)
        if top_level_events_only:
            rows = [r for r in rows if r.top_level]
        if row_limit is not None and row_limit > 0:
            rows = rows[:row_limit]
        return rows

    def __str__(self) -> str:
        return self.table()


def _time(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:.3f}s"
    if us >= 1e3:
        return f"{us / 1e3:.3f}ms"
    return f"{us:.3f}us"


def _share(part: float, total: float) -> str:
    return f"{100.0 * part / total:.2f}%"


def native_key_averages(
    trace: Trace, group_by_input_shape: bool = False, group_by_stack_n: int = 0
) -> KeyAverages:
    events, device_type = host_events(trace)
    groups: dict[tuple, KeyAverage] = {}
    for ev in events:
        key: tuple = (ev.name,)
        if group_by_input_shape:
            key += (str(ev.input_shapes),)
        if group_by_stack_n > 0:
            key += tuple(ev.stack[:group_by_stack_n])
        avg = groups.get(key)
        if avg is None:
            avg = groups[key] = KeyAverage(
                ev.name,
                input_shapes=ev.input_shapes if group_by_input_shape else None,
                stack=ev.stack[:group_by_stack_n] if group_by_stack_n else [],
                top_level=ev.parent is None,
            )
        avg.count += 1
        avg.cpu_time_total += ev.cpu_time_total
        avg.self_cpu_time_total += ev.self_cpu_time_total
        avg.device_time_total += ev.device_time_total
        avg.self_device_time_total += ev.self_device_time_total
        avg.flops += ev.flops
    return KeyAverages(groups.values(), device_type)


def _laid_out(headers: list[str], rows: list[list[str]], header: str | None, totals: list[str]) -> str:
    """torch's table text: columns as wide as their widest cell, names left, numbers right, ruled."""
    widths = [
        max(len(h), *(len(c[i]) for c in rows)) + 2 if rows else len(h) + 2
        for i, h in enumerate(headers)
    ]
    line = "-" * (sum(widths) + len(widths) - 1)

    def fmt(cells: list[str]) -> str:
        return " ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    out = ["=" * len(line), header, "=" * len(line)] if header else []
    out += [line, fmt(headers), line, *(fmt(c) for c in rows), line, *totals]
    return "\n".join(out) + "\n"
