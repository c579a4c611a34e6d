"""The ``torch`` backend: PyTorch operators (aten ops, autograd nodes, torch record_function ranges)
recorded through PyTorch's RecordFunction callbacks, at the C++ level.

* Two recorders. By default (and with ``record_shapes``) polyprof's own observer
  (:mod:`polyprof.backends.torch_observer`, C++ built once against the installed torch) appends each op
  to per-thread columns that are read in bulk after stop. With ``with_stack``, ``with_flops`` or
  ``profile_memory``, or when the observer cannot be built (no C++ compiler; the backend warns and says
  how to fix it) or ``POLYPROF_TORCH_OBSERVER=0``, torch's own collector is used in CPU-only mode
  (``torch._C._autograd._enable_profiler``), which is slower to stop.

* Activity group CPU, available when torch is installed. torch is not imported to find that out, and a
  session does not import it either: it starts torch's collector when the program has imported torch,
  or at the moment the program imports it (so ``polyprof run train.py`` captures the script's ops).
* Only ``ProfilerActivity.CPU`` is asked of torch, so torch's own device tracers are not enabled by
  this backend; polyprof's device plugins own those.
* What each op carries is what torch.profiler writes: ``External id``, ``Sequence number``,
  ``Fwd thread id``, ``Input Dims``/``Input type`` with record_shapes, ``Call stack`` with with_stack,
  ``flops`` with with_flops, forward->backward ``fwdbwd`` flows, ``[memory]`` instant events with
  profile_memory.
* Device work launched by an op gets the op's id as ``External id`` by time containment of its launch
  on the same thread (the engine does this for every backend), since torch offers Python no hook to
  push correlation ids per op.

* Both record the ops of the thread that starts the profile and of threads that inherit its
  RecordFunction state (autograd's), as torch.profiler does.

Uses private torch APIs (``torch._C._autograd._enable_profiler`` and friends), guarded; checked on the
installed torch (2.13) and written against the 2.4+ signatures.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading
from typing import Any

import numpy as np

from polyprof.backend import API_VERSION, Availability, ProfileConfig, SessionContext, Sink
from polyprof.backends import torch_observer
from polyprof.clock import ClockMapping, epoch_offset, host_ns
from polyprof.model import FLOW_AC2G, FLOW_FWDBWD, ActivityKind, ArgColumns, CodedStrings, JSONColumn
from polyprof.model.args import sorted_unique

MIN_TORCH = (2, 4)
EVALUATE_FUNCTION = "autograd::engine::evaluate_function: "
#: torch's activity types -> kinds; "[memory]" instant events are cpu_instant_event
_KIND_BY_TYPE = {
    "cpu_op": ActivityKind.CPU_OP,
    "user_annotation": ActivityKind.USER_ANNOTATION,
    "python_function": ActivityKind.PYTHON_FUNCTION,
    "cpu_instant_event": ActivityKind.INSTANT,
}


BACKWARD_FUNCTION_SCOPE = 1  # at::RecordScope::BACKWARD_FUNCTION

_collector_users: set[int] = set()  # sessions recording through torch's collector right now


def collector_active() -> bool:
    """Whether a polyprof profile records ops through torch's own collector right now. On a CUDA
    machine that collector (Kineto) traces CUDA runtime and driver calls even for CPU-only profiles
    (torch's ``kCpuTypes``), taking CUPTI's buffer callbacks: device backends that use CUPTI check this
    to take them back for the profile's duration."""
    return bool(_collector_users)


def _torch_version(torch: Any) -> tuple[int, int]:
    try:
        major, minor = torch.__version__.split(".")[:2]
        return int(major), int("".join(c for c in minor if c.isdigit()) or 0)
    except Exception:
        return (0, 0)


class _PostImportHook(importlib.abc.MetaPathFinder):
    """Calls `callback(module)` once, right after `name` has been imported."""

    def __init__(self, name: str, callback: Any) -> None:
        self.name = name
        self.callback = callback
        self._busy = False

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name or self._busy:
            return None
        self._busy = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy = False
        if spec is None or spec.loader is None:
            return None
        loader, hook = spec.loader, self

        class Loader(importlib.abc.Loader):
            def create_module(self, s: Any) -> Any:
                return loader.create_module(s)

            def exec_module(self, module: Any) -> None:
                loader.exec_module(module)
                hook.remove()
                hook.callback(module)

        spec.loader = Loader()
        return spec

    def install(self) -> None:
        sys.meta_path.insert(0, self)

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)


class TorchSession:
    thread_affine = True  # torch's profiler must be stopped on the thread that started it

    def __init__(self, config: ProfileConfig, ctx: SessionContext) -> None:
        self.config = config
        self.ctx = ctx
        self.torch: Any = None
        self.result: Any = None
        self.enabled = False
        self.recording = False
        self.hook: _PostImportHook | None = None
        self.pairs: list[tuple[int, int]] = []
        self.enabled_tid = 0
        self.observer: torch_observer.Observer | None = None
        self.observed = -1  # ops recorded by the observer, once stopped
        self.stop_ns = 0
        self.torch_flag_before = False  # torch.autograd.profiler._is_profiler_enabled at start

    # -- lifecycle --------------------------------------------------------------------------------
    def prepare(self) -> None:
        pass

    def start(self) -> None:
        self.recording = True
        self._pair()
        torch = sys.modules.get("torch")
        if torch is not None and hasattr(torch, "_C"):
            self._enable(torch)
        else:
            self.hook = _PostImportHook("torch", self._on_torch_imported)
            self.hook.install()

    def _on_torch_imported(self, torch: Any) -> None:
        if self.recording and not self.enabled:
            try:
                self._enable(torch)
            except Exception as exc:  # never break the program's `import torch`
                self.ctx.report.error(f"enabling torch's profiler after `import torch` failed: {exc}")

    def _config(self, torch: Any) -> tuple[Any, set]:
        from torch._C._profiler import ProfilerActivity, ProfilerConfig, ProfilerState, _ExperimentalConfig

        c = self.config
        cfg = ProfilerConfig(
            ProfilerState.KINETO,
            c.record_shapes or c.with_flops,
            c.profile_memory,
            c.with_stack,
            c.with_flops,
            False,
            _ExperimentalConfig(),
            "",
        )
        return cfg, {ProfilerActivity.CPU}

    def _enable(self, torch: Any) -> None:
        from torch._C._autograd import _enable_profiler, _prepare_profiler

        if _torch_version(torch) < MIN_TORCH:
            self.ctx.report.error(
                f"torch {torch.__version__} is older than the supported 2.4; no aten ops recorded"
            )
            return
        self.torch = torch
        self.enabled_tid = threading.get_native_id()
        self._announce(torch, True)
        observer, why_not = self._observer(torch)
        if observer is not None:
            observer.start(record_shapes=self.config.record_shapes)
            self.observer = observer
            self.enabled = True
            self.ctx.report.detail("recorder", "polyprof observer")
            return
        self.ctx.report.detail("recorder", f"torch collector ({why_not})")
        cfg, acts = self._config(torch)
        _prepare_profiler(cfg, acts)
        _enable_profiler(cfg, acts)
        _collector_users.add(id(self))
        self.enabled = True

    def _announce(self, torch: Any, recording: bool) -> None:
        """Set torch's Python-side "a profiler is on" flag as torch.profiler does: torch.compile'd code
        checks it to emit its own ranges (compiled graphs, Triton kernel launches). The value found at
        start is restored at stop, in case torch.profiler itself runs around this profile."""
        profiler = getattr(getattr(torch, "autograd", None), "profiler", None)
        if profiler is None or not isinstance(getattr(profiler, "_is_profiler_enabled", None), bool):
            return
        if recording:
            self.torch_flag_before = profiler._is_profiler_enabled
            profiler._is_profiler_enabled = True
        else:
            profiler._is_profiler_enabled = self.torch_flag_before

    def _observer(self, torch: Any) -> tuple[torch_observer.Observer | None, str]:
        """(polyprof's observer, "") when it covers the options and loads, else (None, why not): then
        torch's collector records the ops."""
        c = self.config
        needs_collector = [
            name for name in ("with_stack", "with_flops", "profile_memory") if getattr(c, name)
        ]
        if needs_collector:
            return None, f"{', '.join(needs_collector)} need it"
        if torch_observer.disabled():
            return None, "POLYPROF_TORCH_OBSERVER=0"
        try:
            return torch_observer.get(torch), ""
        except torch_observer.BuildError as exc:
            self.ctx.report.warning(
                f"polyprof's torch operator observer is unavailable, so torch's own collector records "
                f"the ops (same ops, slower stop): {exc}. POLYPROF_TORCH_OBSERVER=0 silences this."
            )
            return None, "the observer could not be built"

    def stop(self) -> None:
        self.recording = False
        if self.hook is not None:
            self.hook.remove()
            self.hook = None
        if self.enabled:
            self.enabled = False
            self._announce(self.torch, False)
            if threading.get_native_id() != self.enabled_tid:
                self.ctx.report.error(
                    "torch's profiler was stopped from another thread than the one that started it; "
                    "stop the profile on the thread that started it to get aten ops"
                )
            if self.observer is not None:
                self.observed = self.observer.stop()
                self.stop_ns = self.ctx.window_end or host_ns()
                return
            from torch._C._autograd import _disable_profiler

            try:
                self.result = _disable_profiler()
            finally:
                _collector_users.discard(id(self))
            self._pair()

    def close(self) -> None:
        try:
            self.stop()
        finally:
            self.result = None
            if self.observer is not None:
                self.observer.reset()
                self.observer = None

    def _pair(self) -> None:
        off = epoch_offset()
        now = host_ns()
        self.pairs.append((now + off.offset_ns, now))
        self.uncertainty_ns = max(getattr(self, "uncertainty_ns", 0), off.uncertainty_ns)

    # -- collect ----------------------------------------------------------------------------------
    def collect(self, sink: Sink) -> None:
        if self.observer is not None and self.observed >= 0:
            n, self.observed = self.observed, -1
            try:
                self._collect_observed(sink, n)
            finally:
                self.observer.reset()
            return
        if self.result is None:
            return
        result, self.result = self.result, None
        mapping = ClockMapping.fit(
            [e for e, _ in self.pairs],
            [h for _, h in self.pairs],
            uncertainty_ns=getattr(self, "uncertainty_ns", 0),
        )
        self.ctx.report.clock_mapping(mapping, "torch (epoch ns)")
        host = sink.host_device()
        # Column by column: one comprehension per field keeps the per-event cost to a few C calls.
        events = result.events()
        types = _event_types(events)
        hidden = [ev.is_hidden_event() for ev in events]
        keep = [
            ev for ev, ty, hid in zip(events, types, hidden, strict=True) if ty in _KIND_BY_TYPE and not hid
        ]
        kinds = [
            int(_KIND_BY_TYPE[ty])
            for ty, hid in zip(types, hidden, strict=True)
            if ty in _KIND_BY_TYPE and not hid
        ]
        names = _names(keep)
        tids = [ev.device_resource_id() or ev.start_thread_id() for ev in keep]
        rows = {tid: _thread_row(sink, tid) for tid in set(tids)}
        start = mapping.to_host(np.array([ev.start_ns() for ev in keep], dtype=np.int64))
        duration = np.maximum(np.array([ev.duration_ns() for ev in keep], dtype=np.int64), 0)
        torch_ids = [ev.correlation_id() for ev in keep]
        new_ids = {c: self.ctx.new_correlation_id() for c in dict.fromkeys(torch_ids) if c}
        corr = [new_ids.get(c, 0) for c in torch_ids]
        flow_ids, flow_types, flow_starts = self._flows(keep, kinds, start)
        memory = [i for i, n in enumerate(names) if n == "[memory]"]
        args = self._all_args(keep, kinds, memory)
        n = len(keep)
        if memory:
            self._memory_args(keep, memory, args, _allocation_totals(result))
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
        ids, starts = _fwdbwd_flows(seq, fwd_tid, rf_tid, start, self.ctx)
        return ids, np.where(ids != 0, FLOW_FWDBWD, 0), starts

    def _collect_observed(self, sink: Sink, n: int) -> None:
        """Rows from polyprof's observer: already host-clock ns and native thread ids."""
        assert self.observer is not None
        cols, names = self.observer.columns(n)
        if n == 0:
            return
        seq, fwd_tid = cols["seq"], cols["fwd_tid"]
        user = cols["scope"] == torch_observer.USER_SCOPE
        kinds = np.where(user, int(ActivityKind.USER_ANNOTATION), int(ActivityKind.CPU_OP))
        start, end = cols["start"], cols["end"].copy()
        unfinished = np.flatnonzero(end == 0)
        end[unfinished] = np.maximum(self.stop_ns, start[unfinished])
        tid = cols["tid"]
        threads = sorted_unique(tid)
        thread_rows = np.array([sink.host_thread(t) for t in threads.tolist()], dtype=np.int64)
        ids = self.ctx.new_correlation_ids(n)
        args = _evaluate_function_args(cols["name"], names, seq, fwd_tid, tid)
        arg_columns = None
        if self.config.record_shapes:
            # formatted by the observer: Sequence number, Fwd thread id and the four shape args
            fragments = self.observer.arg_fragments(n)
            arg_columns = ArgColumns(torch_observer.ARG_KEYS, tuple(JSONColumn(f) for f in fragments))
        else:
            args.update(_sequence_args(np.flatnonzero(seq >= 0), seq, fwd_tid))
        for i in unfinished.tolist():
            args[i] = {**args.get(i, {}), "finished": False}
        flow_id, flow_start = _fwdbwd_flows(seq, fwd_tid, cols["rf_tid"], start, self.ctx)
        sink.activities(
            {
                "kind": kinds,
                "name": CodedStrings(cols["name"], names),
                "device": np.full(n, sink.host_device()),
                "resource": thread_rows[np.searchsorted(threads, tid)],
                "start": start,
                "end": end,
                "correlation": ids,
                "external_id": ids,
                "flow_id": flow_id,
                "flow_type": np.where(flow_id != 0, FLOW_FWDBWD, 0),
                "flow_start": flow_start,
            },
            args,
            arg_columns,
        )

    def _all_args(self, keep: list, kinds: list[int], memory: list[int]) -> dict[int, dict]:
        args: dict[int, dict] = {}
        with_shapes = self.config.record_shapes or self.config.with_flops
        cpu_op = int(ActivityKind.CPU_OP)
        seqs = [ev.sequence_nr() if k == cpu_op else -1 for ev, k in zip(keep, kinds, strict=True)]
        for i, seq in enumerate(seqs):
            if seq >= 0:
                args[i] = {"Sequence number": seq, "Fwd thread id": keep[i].fwd_thread_id()}
        if with_shapes or self.config.with_stack or self.config.with_flops:
            skip = set(memory)
            for i, (ev, k) in enumerate(zip(keep, kinds, strict=True)):
                if i in skip:
                    continue
                extra = self._args(ev, ActivityKind(k), with_shapes, sequence=False)
                if extra:
                    args.setdefault(i, {}).update(extra)
        return args

    def _args(
        self, ev: Any, kind: ActivityKind, with_shapes: bool, sequence: bool = True
    ) -> dict[str, Any] | None:
        args: dict[str, Any] = {}
        if kind == ActivityKind.CPU_OP:
            seq = ev.sequence_nr() if sequence else -1
            if seq >= 0:
                args["Sequence number"] = seq
                args["Fwd thread id"] = ev.fwd_thread_id()
            if with_shapes:
                args["Input Dims"] = ev.shapes()
                args["Input type"] = ev.dtypes()
            if self.config.with_flops and ev.flops():
                args["flops"] = ev.flops()
        if self.config.with_stack:
            stack = ev.stack()
            if stack:
                args["Call stack"] = ";".join(stack)
        return args or None

    @staticmethod
    def _memory_args(keep: list, memory: list[int], args: dict[int, dict], totals_by_event: dict) -> None:
        running: dict[tuple[int, int], int] = {}
        for i in memory:
            ev = keep[i]
            nbytes = int(ev.nbytes())
            key = (int(getattr(ev.device_type(), "value", 0) or 0), int(ev.device_index()))
            running[key] = running.get(key, 0) + nbytes
            allocated, reserved = totals_by_event.get((int(ev.start_ns()), nbytes), (running[key], None))
            args[i] = {
                "Device Type": key[0],
                "Device Id": key[1],
                "Bytes": nbytes,
                "Total Allocated": allocated,
            }
            if reserved is not None:
                args[i]["Total Reserved"] = reserved


def _allocation_totals(result: Any) -> dict[tuple[int, int], tuple[int, int]]:
    """(time, bytes) -> (total allocated, total reserved) from torch's event tree, as torch.profiler
    writes them; empty when this torch does not expose them (the backend then counts from the start
    of the profile)."""
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


def _sequence_args(
    rows: np.ndarray, seq: np.ndarray, fwd_tid: np.ndarray, source: np.ndarray | None = None
) -> dict[int, dict]:
    """``Sequence number``/``Fwd thread id`` as torch writes them, for `rows`, taken from the rows
    `source` (default: the rows themselves)."""
    source = rows if source is None else source
    return {
        i: {"Sequence number": s, "Fwd thread id": f}
        for i, s, f in zip(rows.tolist(), seq[source].tolist(), fwd_tid[source].tolist(), strict=True)
    }


def _evaluate_function_args(
    name_codes: np.ndarray, names: list[str], seq: np.ndarray, fwd_tid: np.ndarray, tid: np.ndarray
) -> dict[int, dict]:
    """torch gives autograd's ``evaluate_function`` ranges the ``Sequence number``/``Fwd thread id`` of
    the backward node they run: their first child on the same thread."""
    evaluate = [code for code, name in enumerate(names) if name.startswith(EVALUATE_FUNCTION)]
    if not evaluate:
        return {}
    rows = np.flatnonzero(np.isin(name_codes[:-1], evaluate) & (seq[:-1] < 0))
    children = rows + 1
    linked = (seq[children] >= 0) & (fwd_tid[children] > 0) & (tid[children] == tid[rows])
    return _sequence_args(rows[linked], seq, fwd_tid, children[linked])


def _fwdbwd_flows(
    seq: np.ndarray, fwd_tid: np.ndarray, rf_tid: np.ndarray, start: np.ndarray, ctx: SessionContext
) -> tuple[np.ndarray, np.ndarray]:
    """Forward->backward flows, as torch links them: a backward node (forward thread id > 0) to the
    latest-starting forward op with the same sequence number on that forward thread. Returns (flow id,
    flow start) columns."""
    n = len(seq)
    flow_id = np.zeros(n, dtype=np.int64)
    flow_start = np.zeros(n, dtype=np.int8)
    has_seq = np.flatnonzero(seq >= 0)
    if len(has_seq) == 0:
        return flow_id, flow_start
    order = has_seq[np.argsort(start[has_seq], kind="stable")].tolist()
    forward: dict[tuple[int, int], int] = {}
    backward: dict[tuple[int, int], int] = {}
    seq_l, fwd_l, rf_l = seq.tolist(), fwd_tid.tolist(), rf_tid.tolist()
    for i in order:
        if fwd_l[i] == 0:
            forward[(rf_l[i], seq_l[i])] = i  # the latest start wins
        else:
            backward.setdefault((fwd_l[i], seq_l[i]), i)  # the earliest backward node
    pairs = [(forward[k], b) for k, b in backward.items() if k in forward]
    if pairs:
        ids = ctx.new_correlation_ids(len(pairs))
        fwd_rows = np.array([f for f, _ in pairs], dtype=np.int64)
        bwd_rows = np.array([b for _, b in pairs], dtype=np.int64)
        flow_id[fwd_rows] = ids
        flow_id[bwd_rows] = ids
        flow_start[fwd_rows] = 1
    return flow_id, flow_start


def _event_types(events: list) -> list[str]:
    """Each event's torch activity type; torch < 2.12 has no ``activity_type()``, so what a CPU-only
    profile records is told apart by the flags it has (annotations; ``[memory]`` instants; ops)."""
    if not events or hasattr(events[0], "activity_type"):
        return [ev.activity_type() for ev in events]
    return [
        "user_annotation"
        if ev.is_user_annotation()
        else "cpu_instant_event"
        if name == "[memory]"
        else "cpu_op"
        for ev, name in zip(events, _names(events), strict=True)
    ]


def _names(events: list) -> list[str]:
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


class TorchBackend:
    """PyTorch operators through PyTorch's own collector (activity group CPU)."""

    name = "torch"
    api_version = API_VERSION
    activities = frozenset({"CPU"})

    def probe(self) -> Availability:
        torch = sys.modules.get("torch")
        if torch is not None:
            version = getattr(torch, "__version__", "?")
            if _torch_version(torch) < MIN_TORCH:
                return Availability.no(f"torch {version} is older than 2.4, the oldest this backend supports")
            return Availability.yes(devices=["aten operators"], torch=version)
        try:
            spec = importlib.util.find_spec("torch")
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            return Availability.no(
                "torch is not installed (pip install torch) - aten operators are not recorded"
            )
        return Availability.yes(devices=["aten operators (once the program imports torch)"])

    def create_session(self, config: ProfileConfig, ctx: SessionContext) -> TorchSession:
        return TorchSession(config, ctx)


backend = TorchBackend()
