"""torch's own collector (``torch._C._autograd._enable_profiler`` in CPU-only mode), the torch backend's
recorder for ``with_stack`` with ``profile_memory`` and wherever polyprof's observer cannot be built.
Its events are turned into rows column by column; torch's result object is attached to the trace for the analyses that need
torch's own event tree (``prof.profiler.kineto_results.experimental_event_tree()``,
``export_memory_timeline``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from polyprof.backends.torch import flows
from polyprof.model import FLOW_AC2G, FLOW_FWDBWD, ActivityKind
from polyprof.plugin import facilities
from polyprof.plugin.backend import ProfileConfig, SessionContext
from polyprof.plugin.clock import ClockMapping
from polyprof.plugin.sink import Sink
from polyprof.torch.attachments import TORCH_RESULT

BACKWARD_FUNCTION_SCOPE = 1  # at::RecordScope::BACKWARD_FUNCTION
#: torch's activity types -> kinds; "[memory]" instant events are cpu_instant_event
KIND_BY_TYPE = {
    "cpu_op": ActivityKind.CPU_OP,
    "user_annotation": ActivityKind.USER_ANNOTATION,
    "python_function": ActivityKind.PYTHON_FUNCTION,
    "cpu_instant_event": ActivityKind.INSTANT,
}

#: Who holds CUPTI while polyprof records through torch's collector: on a CUDA machine that collector
#: (Kineto) traces CUDA runtime and driver calls even for CPU-only profiles (torch's ``kCpuTypes``),
#: taking CUPTI's buffer callbacks; device backends that use CUPTI see this holder
#: (``ctx.facility_holder(facilities.CUPTI)``) and take them back for the profile's duration.
CUPTI_HOLDER = "torch"


def torch_config(config: ProfileConfig) -> tuple[Any, set]:
    """torch's ProfilerConfig and activities for a CPU-only collection with `config`'s options."""
    from torch._C._profiler import ProfilerActivity, ProfilerConfig, ProfilerState, _ExperimentalConfig

    experimental = config.extra.get("torch_experimental_config") or _ExperimentalConfig()
    cfg = ProfilerConfig(
        ProfilerState.KINETO,
        config.record_shapes or config.with_flops,
        config.profile_memory,
        config.with_stack,
        config.with_flops,
        config.with_modules,
        experimental,
        "",
    )
    return cfg, {ProfilerActivity.CPU}


class Collector:
    """Start, stop and collect torch's collector for one session."""

    def __init__(self, config: ProfileConfig, ctx: SessionContext) -> None:
        self.config = config
        self.ctx = ctx
        self.result: Any = None

    def start(self) -> None:
        from torch._C._autograd import _enable_profiler, _prepare_profiler

        cfg, acts = torch_config(self.config)
        _prepare_profiler(cfg, acts)
        _enable_profiler(cfg, acts)
        facilities.hold(facilities.CUPTI, CUPTI_HOLDER)

    def stop(self) -> None:
        from torch._C._autograd import _disable_profiler

        try:
            self.result = _disable_profiler()
        finally:
            facilities.release(facilities.CUPTI, CUPTI_HOLDER)

    def collect(self, sink: Sink, mapping: ClockMapping) -> None:
        if self.result is None:
            return
        result, self.result = self.result, None
        self.ctx.report.attach(TORCH_RESULT, result)
        host = sink.host_device()
        # Column by column: one comprehension per field keeps the per-event cost to a few C calls.
        events = result.events()
        types = event_types(events)
        hidden = [ev.is_hidden_event() for ev in events]
        keep = [
            ev for ev, ty, hid in zip(events, types, hidden, strict=True) if ty in KIND_BY_TYPE and not hid
        ]
        kinds = [
            int(KIND_BY_TYPE[ty]) for ty, hid in zip(types, hidden, strict=True) if ty in KIND_BY_TYPE and not hid
        ]
        names = event_names(keep)
        tids = [ev.device_resource_id() or ev.start_thread_id() for ev in keep]
        rows = {tid: _thread_row(sink, tid) for tid in set(tids)}
        start = mapping.to_host(np.array([ev.start_ns() for ev in keep], dtype=np.int64))
        duration = np.maximum(np.array([ev.duration_ns() for ev in keep], dtype=np.int64), 0)
        torch_ids = [ev.correlation_id() for ev in keep]
        new_ids = {c: self.ctx.new_correlation_id() for c in dict.fromkeys(torch_ids) if c}
        corr = [new_ids.get(c, 0) for c in torch_ids]
        flow_ids, flow_types, flow_starts = self._flows(keep, kinds, start)
        memory = [i for i, n in enumerate(names) if n in ("[memory]", "[OutOfMemory]")]
        args = self._all_args(keep, kinds, memory)
        n = len(keep)
        if memory:
            _memory_args(keep, memory, args, _allocation_totals(result))
        sink.activities(
            {
                "kind": kinds,
                "name": names,
                "device": np.full(n, host),
                "resource": np.array([rows[t] for t in tids], dtype=np.int64),
                "start": start,
                "end": start + duration,
                "correlation": corr,
                "external_id": corr,
                "flow_id": flow_ids,
                "flow_type": flow_types,
                "flow_start": flow_starts,
            },
            args,
        )

    def _flows(self, keep: list, kinds: list[int], start: np.ndarray) -> tuple[Any, Any, Any]:
        """(flow id, flow type, flow start) columns: torch's own fwdbwd/ac2g links where its events
        expose them (torch >= 2.12), else fwdbwd flows rebuilt from sequence numbers as torch links
        them."""
        if not keep:
            return [], [], []
        if hasattr(keep[0], "flow_type"):
            types = [ev.flow_type() for ev in keep]
            ids = [
                ev.flow_id() if ft in (FLOW_FWDBWD, FLOW_AC2G) else 0
                for ev, ft in zip(keep, types, strict=True)
            ]
            return (
                ids,
                [ft if fid else 0 for ft, fid in zip(types, ids, strict=True)],
                [int(ev.flow_start()) if fid else 0 for ev, fid in zip(keep, ids, strict=True)],
            )
        cpu_op = int(ActivityKind.CPU_OP)
        seq = np.array([ev.sequence_nr() if k == cpu_op else -1 for ev, k in zip(keep, kinds, strict=True)])
        fwd_tid = np.array([ev.fwd_thread_id() for ev in keep], dtype=np.int64)
        # a backward edge ends on the autograd node (scope BACKWARD_FUNCTION), not on the
        # evaluate_function range around it, which carries the same numbers
        scope = np.array([ev.scope() for ev in keep], dtype=np.int64)
        seq[(fwd_tid > 0) & (scope != BACKWARD_FUNCTION_SCOPE)] = -1
        rf_tid = np.array([ev.start_thread_id() for ev in keep], dtype=np.uint64).astype(np.int64)
        ids, starts = flows.fwdbwd_flows(seq, fwd_tid, rf_tid, start, self.ctx)
        return ids, np.where(ids != 0, FLOW_FWDBWD, 0), starts

    def _all_args(self, keep: list, kinds: list[int], memory: list[int]) -> dict[int, dict]:
        args: dict[int, dict] = {}
        c = self.config
        with_shapes = c.record_shapes or c.with_flops
        cpu_op = int(ActivityKind.CPU_OP)
        seqs = [ev.sequence_nr() if k == cpu_op else -1 for ev, k in zip(keep, kinds, strict=True)]
        for i, seq in enumerate(seqs):
            if seq >= 0:
                args[i] = {"Sequence number": seq, "Fwd thread id": keep[i].fwd_thread_id()}
        skip = set(memory)
        for i, (ev, k) in enumerate(zip(keep, kinds, strict=True)):
            if i in skip:
                continue
            extra = self._args(ev, ActivityKind(k), with_shapes)
            if extra:
                args.setdefault(i, {}).update(extra)
        return args

    def _args(self, ev: Any, kind: ActivityKind, with_shapes: bool) -> dict[str, Any] | None:
        c = self.config
        args: dict[str, Any] = {}
        if kind in (ActivityKind.CPU_OP, ActivityKind.USER_ANNOTATION):
            args["Record function id"] = 0
        if kind == ActivityKind.CPU_OP:
            if with_shapes:
                args["Input Dims"] = ev.shapes()
                args["Input type"] = ev.dtypes()
            if c.with_flops and ev.flops():
                args["flops"] = ev.flops()
        if c.with_stack:
            stack = ev.stack()
            if stack:
                args["Call stack"] = ";".join(stack)
        if kind == ActivityKind.PYTHON_FUNCTION:
            for key, getter in (
                ("Python id", "python_id"),
                ("Python parent id", "python_parent_id"),
                ("Python module id", "python_module_id"),
            ):
                value = getattr(ev, getter, None)
                if value is not None and value() >= 0:
                    args[key] = value()
        return args or None


def _memory_args(keep: list, memory: list[int], args: dict[int, dict], totals_by_event: dict) -> None:
    running: dict[tuple[int, int], int] = {}
    for i in memory:
        ev = keep[i]
        nbytes = int(ev.nbytes())
        key = (int(getattr(ev.device_type(), "value", 0) or 0), int(ev.device_index()))
        running[key] = running.get(key, 0) + nbytes
        allocated, reserved, addr = totals_by_event.get(
            (int(ev.start_ns()), nbytes), (running[key], None, None)
        )
        args[i] = {"Device Type": key[0], "Device Id": key[1], "Bytes": nbytes, "Total Allocated": allocated}
        if reserved is not None:
            args[i]["Total Reserved"] = reserved
        if addr is not None:
            args[i]["Addr"] = addr


def _allocation_totals(result: Any) -> dict[tuple[int, int], tuple[int, int, int]]:
    """(time, bytes) -> (total allocated, total reserved, address) from torch's event tree, as
    torch.profiler writes them; empty when this torch does not expose them (the backend then counts
    from the start of the profile)."""
    try:
        from torch._C._profiler import _EventType

        totals = {}
        stack = list(result.experimental_event_tree())
        while stack:
            ev = stack.pop()
            stack.extend(ev.children)
            if ev.tag == _EventType.Allocation:
                f = ev.extra_fields
                totals[(int(ev.start_time_ns), int(f.alloc_size))] = (
                    int(f.total_allocated),
                    int(f.total_reserved),
                    int(f.ptr),
                )
        return totals
    except Exception:
        return {}


def _thread_row(sink: Sink, tid: int) -> int:
    # torch reports uint64(-1) for events of threads it does not know, such as the python_function
    # frames with_stack finds on other Python threads parked when the profile starts
    if not 0 <= tid < 2**63:
        return sink.host_thread(0, "unknown thread")
    return sink.host_thread(tid)


def event_types(events: list) -> list[str]:
    """Each event's torch activity type; torch < 2.12 has no ``activity_type()``, so what a CPU-only
    profile records is told apart by the flags it has (annotations; ``[memory]`` instants; ops)."""
    if not events or hasattr(events[0], "activity_type"):
        return [ev.activity_type() for ev in events]
    return [
        "user_annotation"
        if ev.is_user_annotation()
        else "cpu_instant_event"
        if name in ("[memory]", "[OutOfMemory]")
        else "cpu_op"
        for ev, name in zip(events, event_names(events), strict=True)
    ]


def event_names(events: list) -> list[str]:
    try:
        return [ev.name() for ev in events]
    except UnicodeDecodeError:  # some Python function names do not decode; keep the rest
        names = []
        for ev in events:
            try:
                names.append(ev.name())
            except UnicodeDecodeError:
                names.append("<undecodable name>")
        return names
