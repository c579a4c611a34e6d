"""A polyprof trace as torch's profiler results, so that torch's own post-processing serves it.

``prof.profiler`` of ``polyprof.profiler.profile`` is a real ``torch.autograd.profiler.profile`` whose
``kineto_results`` is a :class:`TraceResult`: an object with the methods of torch's
``_ProfilerResult`` (``events()``, ``trace_start_ns()``, ``experimental_event_tree()``, ``save()``)
over polyprof's trace, whose events have the methods of torch's ``_KinetoEvent``. torch's code then
builds the ``FunctionEvent`` list, the operator tree, ``key_averages()`` and its table (memory,
FLOPs, overload and source columns included), ``export_stacks`` and the post-processing timeout,
exactly as it does for its own results::

    view = autograd_view(trace, config)       # torch.autograd.profiler.profile, never entered
    view.function_events                      # torch's EventList
    view.kineto_results.events()[0].name()
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from polyprof.model import DEVICE_KINDS, ActivityKind, ArgColumns, Trace
from polyprof.profiler.torch_fields import MEMORY_NAMES, TreeFields, concrete_value
from polyprof.torch.attachments import OVERLOAD_ARG, PYTHON_CALLS, TORCH_RESULT
from polyprof.torch.observer import ARG_KEYS

USER_SCOPE = 7
_PYTHON = int(ActivityKind.PYTHON_FUNCTION)
#: args that are not an op's keyword arguments (Kineto's own fields)
STANDARD_ARGS = frozenset({
    *ARG_KEYS, "External id", "Record function id", "Ev Idx", "Call stack", "Module Hierarchy", "flops", "finished",
    "Python id", "Python parent id", "Python module id", "correlation", OVERLOAD_ARG, "args",
})
HOST_KINDS = frozenset(int(k) for k in (ActivityKind.CPU_OP, ActivityKind.USER_ANNOTATION, ActivityKind.PYTHON_FUNCTION,
                                        ActivityKind.INSTANT))


def device_type_of(torch: Any, device_type: str) -> Any:
    """torch's DeviceType for a polyprof device type ("cuda", "xpu", "opencl"...)."""
    DeviceType = torch.autograd.DeviceType  # noqa: N806 - torch's name
    known = {"cpu": DeviceType.CPU, "cuda": DeviceType.CUDA, "gpu": DeviceType.CUDA, "xpu": DeviceType.XPU}
    return known.get(device_type.lower(), DeviceType.PrivateUse1)


def _id_arg(args: dict, key: str) -> int:
    """An id arg as torch's KinetoEvent gives it: -1 where there is none (a null in the trace)."""
    value = args.get(key)
    return -1 if value is None else int(value)


def _flat_shapes(dims: list) -> list:
    """torch's shapes(): a tensor list's input is [] (its sizes are in structured_input_shapes)."""
    return [[] if (isinstance(d, list) and d and isinstance(d[0], list)) else d for d in dims]


class TraceEvent:
    """One row of a trace with the methods of torch's ``_KinetoEvent``."""

    __slots__ = (
        "_name",
        "_overload",
        "_start",
        "_end",
        "_tid",
        "_device_type",
        "_device_index",
        "_resource",
        "_correlation",
        "_linked",
        "_external",
        "_kind",
        "_cat",
        "_args",
        "_flow",
        "_stack",
    )

    def __init__(self, name, overload, start, end, tid, device_type, device_index, resource, correlation,
                 linked, external, kind, cat, args, flow) -> None:
        self._name = name
        self._overload = overload
        self._start = start
        self._end = end
        self._tid = tid
        self._device_type = device_type
        self._device_index = device_index
        self._resource = resource
        self._correlation = correlation
        self._linked = linked
        self._external = external
        self._kind = kind
        self._cat = cat
        self._args = args
        self._flow = flow
        self._stack: list[str] | None = None  # with_stack and verbose: the Python calls around it

    # identity and time
    def name(self) -> str:
        return self._name

    def overload_name(self) -> str:
        return self._overload

    def start_ns(self) -> int:
        return self._start

    def end_ns(self) -> int:
        return self._end

    def duration_ns(self) -> int:
        return self._end - self._start

    def start_thread_id(self) -> int:
        return self._tid

    def end_thread_id(self) -> int:
        return self._tid

    def device_type(self) -> Any:
        return self._device_type

    def device_index(self) -> int:
        return self._device_index

    def device_resource_id(self) -> int:
        return self._resource

    def correlation_id(self) -> int:
        return self._correlation

    def linked_correlation_id(self) -> int:
        return self._linked

    def external_id(self) -> int:
        return self._external

    def activity_type(self) -> str:
        return self._cat

    def is_async(self) -> bool:
        return False

    def is_hidden_event(self) -> bool:
        return False

    def is_user_annotation(self) -> bool:
        return self._kind == int(ActivityKind.USER_ANNOTATION)

    def is_python_function(self) -> bool:
        return self._kind == int(ActivityKind.PYTHON_FUNCTION)

    def scope(self) -> int:
        return USER_SCOPE if self._kind == int(ActivityKind.USER_ANNOTATION) else 0

    # op fields from the args torch.profiler writes
    def sequence_nr(self) -> int:
        return int(self._args.get("Sequence number", -1))

    def fwd_thread_id(self) -> int:
        return int(self._args.get("Fwd thread id", 0))

    def shapes(self) -> list:
        return _flat_shapes(self._args.get("Input Dims", []))

    def structured_input_shapes(self) -> list:
        return self._args.get("Input Dims", [])

    def structured_input_strides(self) -> list:
        return self._args.get("Input Strides", [])

    def dtypes(self) -> list:
        return self._args.get("Input type", [])

    def concrete_inputs(self) -> list:
        return [concrete_value(v) for v in self._args.get("Concrete Inputs", [])]

    def kwinputs(self) -> dict:
        if self._kind != int(ActivityKind.CPU_OP) and self._kind != int(ActivityKind.USER_ANNOTATION):
            return {}
        return {k: v for k, v in self._args.items() if k not in STANDARD_ARGS}

    def stack(self) -> list:
        if self._stack is not None:
            return self._stack
        stack = self._args.get("Call stack", "")
        return [s for s in stack.split(";") if s] if isinstance(stack, str) else []

    def module_hierarchy(self) -> list:
        text = self._args.get("Module Hierarchy", "")
        return [s for s in text.split(".") if s] if isinstance(text, str) else []

    def flops(self) -> int:
        return int(self._args.get("flops", 0) or 0)

    def nbytes(self) -> int:
        return int(self._args.get("Bytes", 0))

    def metadata_json(self) -> str:
        return json.dumps(self._args)[1:-1] if "Ev Idx" in self._args else ""

    def extra_meta(self) -> dict:
        return {}

    def python_id(self) -> int:
        return _id_arg(self._args, "Python id")

    def python_parent_id(self) -> int:
        return _id_arg(self._args, "Python parent id")

    def python_module_id(self) -> int:
        return _id_arg(self._args, "Python module id")

    def flow_id(self) -> int:
        return self._flow[0]

    def flow_type(self) -> int:
        return self._flow[1]

    def flow_start(self) -> bool:
        return self._flow[2]

    def cuda_elapsed_us(self) -> int:
        return 0

    def privateuse1_elapsed_us(self) -> int:
        return 0

    def __repr__(self) -> str:
        return f"<polyprof TraceEvent {self._name!r} {self._cat}>"


class TreeNode:
    """A node of :meth:`TraceResult.experimental_event_tree` (what ``torch.profiler._utils`` and the
    profiler's tests walk): name, times, thread, children, parent, ``tag`` (torch's ``_EventType``) and
    ``extra_fields`` (for a Python call, an object that is an instance of torch's ``_ExtraFields_PyCall``
    or ``_ExtraFields_PyCCall``, see :func:`python_fields`)."""

    __slots__ = ("name", "start_time_ns", "end_time_ns", "start_tid", "children", "parent", "extra_fields", "tag",
                 "id", "correlation_id", "overload_name", "event", "unfinished", "finished")

    def __init__(self, event: TraceEvent, ident: int) -> None:
        self.event = event
        self.name = event.name()
        self.overload_name = event.overload_name()
        self.start_time_ns = event.start_ns()
        self.end_time_ns = event.end_ns()
        self.start_tid = event.start_thread_id()
        self.correlation_id = event.correlation_id()
        self.children: list[TreeNode] = []
        self.parent: TreeNode | None = None
        self.extra_fields: Any = None
        self.tag: Any = None
        self.id = ident
        self.unfinished = event._args.get("finished") is False  # a range that never ended (Kineto's flag)
        self.finished = False

    @property
    def duration_time_ns(self) -> int:
        return self.end_time_ns - self.start_time_ns

    @property
    def typed(self) -> tuple[Any, Any]:
        return self.tag, self.extra_fields

    def __repr__(self) -> str:
        return f"<polyprof TreeNode {self.name!r}>"


class TraceResult:
    """A trace with the methods of torch's ``_ProfilerResult`` (see the module docstring). With
    `python_stacks` (``with_stack`` and ``verbose``, as torch gives them), each event's ``stack()`` is
    the Python calls around it, innermost first."""

    def __init__(self, trace: Trace, python_stacks: bool = False) -> None:
        self.trace = trace
        self.python_stacks = python_stacks
        self._events: list[TraceEvent] | None = None
        self._roots: list[TreeNode] | None = None

    def trace_start_ns(self) -> int:
        return int(self.trace.window[0] + self.trace.epoch_offset_ns)

    def events(self) -> list[TraceEvent]:
        if self._events is None:
            self._events = _events(self.trace)
            if self.python_stacks:
                self.experimental_event_tree()
        return self._events

    def trace_activities(self) -> list[TraceEvent]:
        return [e for e in self.events() if e.device_type() != _cpu()]

    def experimental_event_tree(self) -> list:
        torch_result = self.trace.attachments.get(TORCH_RESULT)
        if torch_result is not None:  # torch's collector recorded the ops: its own tree, PyCalls and all
            return torch_result.experimental_event_tree()
        if self._roots is None:
            cpu = _cpu()
            self._roots = build_tree([e for e in self.events() if e.device_type() == cpu],
                                     self.trace.attachments.get(PYTHON_CALLS))
            if self.python_stacks:
                _set_python_stacks(self._roots)
        return self._roots

    def save(self, path: str) -> None:
        from polyprof.formats.files import write_trace

        write_trace(self.trace, path)


def _cpu() -> Any:
    import torch

    return torch.autograd.DeviceType.CPU


def _events(trace: Trace) -> list[TraceEvent]:
    import torch

    acts = trace.activities
    n = len(acts)
    if not n:
        return []
    cpu = torch.autograd.DeviceType.CPU
    device_types = [device_type_of(torch, d.type) if d.type != "cpu" else cpu for d in trace.devices]
    offset = trace.epoch_offset_ns
    kind = acts["kind"].astype(np.int64)
    names = acts.names().tolist()
    cats = np.asarray(acts.strings.strings, dtype=object)[acts["cat"]].tolist()
    start = (acts["start"] + offset).tolist()
    end = (acts["end"] + offset).tolist()
    device = acts["device"].tolist()
    resource_ids = [r.id for r in trace.resources]
    resource = [resource_ids[r] if 0 <= r < len(resource_ids) else 0 for r in acts["resource"].tolist()]
    corr, ext = acts["correlation"].tolist(), acts["external_id"].tolist()
    flow = list(zip(acts["flow_id"].tolist(), acts["flow_type"].tolist(), (acts["flow_start"] != 0).tolist(), strict=True))
    is_device = np.isin(kind, [int(k) for k in DEVICE_KINDS]).tolist()
    host_like = np.isin(kind, list(HOST_KINDS)).tolist()
    has_args = set(acts.args.rows().tolist())
    out = []
    for i in range(n):
        args = acts.args[i] if i in has_args else {}
        dev = device[i]
        if is_device[i]:
            dtype = device_types[dev] if 0 <= dev < len(device_types) else torch.autograd.DeviceType.PrivateUse1
            dindex = trace.devices[dev].index if 0 <= dev < len(trace.devices) else 0
            tid, res, linked = 0, resource[i], ext[i]
        else:
            dtype, dindex, tid, res = cpu, 0, resource[i], 0
            linked = 0 if host_like[i] else ext[i]  # runtime calls hang off the op that made them
        name, overload = names[i], ""
        if OVERLOAD_ARG in args:
            overload = str(args[OVERLOAD_ARG])
            if name.endswith("." + overload):
                name = name[: -len(overload) - 1]
        if names[i] in MEMORY_NAMES:
            dtype = torch.autograd.DeviceType(int(args.get("Device Type", 0)))
            dindex = int(args.get("Device Id", 0))
        out.append(
            TraceEvent(name, overload, start[i], end[i], tid, dtype, dindex, res, corr[i], linked, ext[i],
                       int(kind[i]), cats[i], args, flow[i])
        )
    return out


def build_tree(events: list[TraceEvent], calls: Any = None) -> list[TreeNode]:
    """The host events' tree, built as torch.profiler builds its own (``build_tree`` in its
    collection.cpp): in start order, each event's parent is the innermost event still open on its
    thread (an op of the autograd engine's thread with none, the innermost on its forward thread);
    an event is open until its end has passed (an event starting at another's end nests in it); a
    range that never ended stays open until its parent ends. Returns the roots in start order."""
    import heapq

    fields = TreeFields(calls)
    nodes = [TreeNode(e, i) for i, e in enumerate(events)]
    for node in nodes:
        fields.fill(node)
    order = sorted(range(len(nodes)), key=lambda i: nodes[i].start_time_ns)
    stacks: dict[int, TreeNode] = {}
    ends: list[tuple[int, int, TreeNode]] = []

    def finish(node: TreeNode) -> None:
        node.finished = True

    def pop(node: TreeNode) -> None:
        if node.finished:
            return
        frame = stacks.get(node.start_tid)
        chain = frame
        while chain is not None and chain is not node:
            chain = chain.parent
        if chain is None:  # not on its thread's stack (attached across threads): it just ends
            finish(node)
            return
        while frame is not node:
            finish(frame)
            frame = frame.parent
        finish(node)
        if node.parent is None:
            del stacks[node.start_tid]
        else:
            stacks[node.start_tid] = node.parent

    roots: list[TreeNode] = []
    for seq, i in enumerate(order):
        node = nodes[i]
        while ends and ends[0][0] < node.start_time_ns:
            pop(heapq.heappop(ends)[2])
        parent = stacks.get(node.start_tid)
        if parent is None:
            fwd = node.event.fwd_thread_id() if node.tag is None or fields.is_op(node) else 0
            parent = stacks.get(fwd) if fwd else None
        if parent is not None:
            node.parent = parent
            parent.children.append(node)
        else:
            roots.append(node)
        if node.unfinished:
            stacks[node.start_tid] = node  # no end event: open until its parent's end pops it
        elif node.end_time_ns > node.start_time_ns:
            stacks[node.start_tid] = node
            heapq.heappush(ends, (node.end_time_ns, seq, node))
        else:
            finish(node)
    while ends:
        pop(heapq.heappop(ends)[2])
    return roots


def _set_python_stacks(roots: list[TreeNode]) -> None:
    """Each event's stack: the names of the Python calls around it, innermost first (torch's
    ``KinetoEvent.stack()`` with ``with_stack`` and ``verbose``)."""
    todo = [(r, ()) for r in roots]
    while todo:
        node, around = todo.pop()
        node.event._stack = list(reversed(around))
        inner = (*around, node.name) if node.tag is not None and node.event._kind == _PYTHON else around
        todo.extend((child, inner) for child in node.children)


def autograd_view(trace: Trace, *, use_device: str | None, previous: Any = None, **options: Any) -> Any:
    """A ``torch.autograd.profiler.profile`` (never entered) over `trace`: its ``function_events``,
    ``key_averages()``, ``table()``, ``export_stacks()`` are torch's over polyprof's rows. `previous`:
    the view of the last cycle, reused with ``acc_events`` (its events are kept, as torch does)."""
    from torch.autograd.profiler import profile as autograd_profile

    view = previous
    if view is None:
        view = autograd_profile(use_kineto=True, use_cpu=True, **options)
    if view._function_events is not None and view.acc_events:
        view._old_function_events = view._function_events
    view._function_events = None
    view._needs_processing = True
    view.use_device = use_device
    view.kineto_results = TraceResult(trace, python_stacks=bool(options.get("with_stack")) and _verbose(options))
    w0, w1 = trace.window
    view._stats.profiling_window_duration_sec = (w1 - w0) / 1e9
    view.profiling_start_time_ns, view.profiling_end_time_ns = w0, w1
    if view.acc_events and not view.experimental_config.trace_only:
        view._ensure_function_events()
    return view


def add_call_stacks(trace: Trace) -> None:
    """Each op's and annotation's "Call stack" arg, as torch writes it with ``with_stack`` and
    ``verbose``: the Python calls around it, innermost first, each followed by ";"."""
    events = TraceResult(trace, python_stacks=True).events()
    kinds = (int(ActivityKind.CPU_OP), int(ActivityKind.USER_ANNOTATION))
    rows = [i for i, e in enumerate(events) if e._kind in kinds and e._stack]
    if rows:
        values = np.array(["".join(f"{frame};" for frame in events[i]._stack) for i in rows], dtype=object)
        trace.activities.args.add_block(np.array(rows, dtype=np.int64), ArgColumns(("Call stack",), (values,)))


def _verbose(options: dict[str, Any]) -> bool:
    """``_ExperimentalConfig(verbose=True)``: torch gives each event its Python stack only then."""
    from polyprof.profiler.options import experimental_fields

    config = options.get("experimental_config")
    return config is not None and bool(experimental_fields(config).get("verbose"))
