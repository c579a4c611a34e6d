"""The ``python`` backend: every Python function call on every thread, as ``python_function`` slices on
the same thread rows as annotations and ops (activity group PYTHON; asked for by name, never on by
default: tracing every call costs time).

::

    with polyprof.profile(["cpu", "python"], backend_options={"python": {"min_duration_us": 1}}) as prof:
        train()
    polyprof run --activities cpu,python script.py

The per-call work is C (``_native/csrc/pytrace.c``, the interpreter's profile hook on every thread, and on new
threads through ``threading.setprofile``): two clock reads and a few stores per call, into per-thread
columns. A slice is named as torch.profiler names its Python events (``file.py(12): function``; C
functions, with ``c_calls``, ``<built-in method ...>``). Slices nest strictly per thread (each is written
when its function returns), so Perfetto keeps them all; a coroutine appears as one slice per resumption,
inside the event loop's own frames. Options (``backend_options={"python": {...}}``):

* ``min_duration_us`` (default 0): calls shorter than this are left out (counted as ``dropped``).
* ``max_depth`` (default 128): frames deeper than this are left out (counted).
* ``c_calls`` (default false): also calls into C functions (``len``, ``list.append``...).
* ``fold_libraries`` (default true): a call into the standard library or site-packages is one slice,
  without the library calls it makes (user code it calls back is kept): a large program's library
  internals are folded away. polyprof's own frames and threads are never recorded.
* ``include`` / ``exclude``: globs on the module's file path or the function's qualified name; a slice
  is kept when it matches an include (if any) and no exclude.

On 3.10/3.11 it uses the interpreter's profile hook, as cProfile and VizTracer do: while it records,
another tool's hook (``sys.setprofile``) is replaced, and given back at stop.

A profile with ``with_stack=True`` records as torch.profiler's Python tracer does instead (*torch style*,
:mod:`polyprof.backends.python_calls`): every call, C functions included, no library folding, only the
threads there when recording starts, named and numbered as torch names them (``Python id``, ``Python
parent id``, ``nn.Module: Linear_0``), with each call's callsite and caller for the call tree
(``experimental_event_tree()``). ``min_duration_us``, ``max_depth``, ``include`` and ``exclude`` still apply.
"""

from __future__ import annotations

import fnmatch
import os
import sys
import sysconfig
import threading
from typing import Any

import numpy as np

from polyprof.backends import python_calls
from polyprof.model import ActivityKind, CodedStrings
from polyprof.plugin.backend import API_VERSION, Availability, ProfileConfig, SessionContext
from polyprof.plugin.options import Option, OptionSchema
from polyprof.plugin.sink import Sink
from polyprof.plugin.traits import BackendTraits, SessionTraits
from polyprof.torch.attachments import PYTHON_CALLS

OPTIONS = OptionSchema(
    Option("min_duration_us", float, default=0.0, minimum=0, help="leave out calls shorter than this"),
    Option("max_depth", int, default=128, minimum=1, help="leave out frames deeper than this"),
    Option("c_calls", bool, default=False, help="also record calls into C functions"),
    Option("fold_libraries", bool, default=True, help="a call into the standard library or site-packages is one slice"),
    Option("include", list, items=str, help="globs on file path or function name to keep"),
    Option("exclude", list, items=str, help="globs on file path or function name to drop"),
)


POLYPROF_FILES = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def library_prefixes() -> tuple[str, ...]:
    """The folders of the standard library and installed packages, and frozen modules."""
    paths = sysconfig.get_paths()
    found = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return (*sorted(p.rstrip(os.sep) + os.sep for p in found if p), "<frozen ")


def slice_name(obj: Any) -> str:
    """torch.profiler's name for a Python event: ``path(line): qualname``, or ``<built-in ...>``."""
    if isinstance(obj, str):  # a C function, named by the tracer (``append of list object``)
        return f"<built-in method {obj}>"
    if hasattr(obj, "co_filename"):
        return f"{obj.co_filename}({obj.co_firstlineno}): {getattr(obj, 'co_qualname', obj.co_name)}"
    return f"<built-in method {getattr(obj, '__qualname__', None) or getattr(obj, '__name__', repr(obj))}>"


USE_MONITORING = sys.version_info >= (3, 12)  # sys.monitoring: every thread at once, no profile hook


class Monitoring:
    """The C callbacks under a sys.monitoring tool id of polyprof's own (the profiler id when free),
    their events on only while recording."""

    def __init__(self, c_calls: bool) -> None:
        from polyprof import _native as tracer

        self.mon = sys.monitoring  # type: ignore[attr-defined]
        free = [t for t in (self.mon.PROFILER_ID, 0, 1, 3, 4) if self.mon.get_tool(t) is None]
        if not free:
            raise RuntimeError("every sys.monitoring tool id is taken by other tools")
        self.tool = free[0]
        e = self.mon.events
        self.callbacks = {e.PY_START: tracer.pytrace_mon_py_start, e.PY_RESUME: tracer.pytrace_mon_py_start,
                          e.PY_THROW: tracer.pytrace_mon_py_start, e.PY_RETURN: tracer.pytrace_mon_py_end,
                          e.PY_YIELD: tracer.pytrace_mon_py_end, e.PY_UNWIND: tracer.pytrace_mon_py_end}
        if c_calls:
            self.callbacks.update({e.CALL: tracer.pytrace_mon_call, e.C_RETURN: tracer.pytrace_mon_c_end,
                                   e.C_RAISE: tracer.pytrace_mon_c_end})

    def on(self) -> None:
        self.mon.use_tool_id(self.tool, "polyprof")
        mask = 0
        for event, fn in self.callbacks.items():
            self.mon.register_callback(self.tool, event, fn)
            mask |= event
        self.mon.set_events(self.tool, mask)

    def off(self) -> None:
        self.mon.set_events(self.tool, 0)
        for event in self.callbacks:
            self.mon.register_callback(self.tool, event, None)
        self.mon.free_tool_id(self.tool)


class PythonSession:
    traits = SessionTraits(in_process=True)  # polyprof's own: called directly, not on a guard thread

    def __init__(self, config: ProfileConfig, ctx: SessionContext) -> None:
        from polyprof import _native

        self.ctx = ctx
        self.opts = dict(ctx.options)
        self.torch_style = config.with_stack  # as torch.profiler's with_stack records Python calls
        self.tracer = _native
        self.buffers: list[Any] = []
        self.previous: Any = None
        self.monitor: Monitoring | None = None
        self.running = False

    def prepare(self) -> None:
        pass

    def start(self) -> None:
        o = self.opts
        torch_style = self.torch_style
        c_calls = torch_style or bool(o.get("c_calls"))
        fold = library_prefixes() if o.get("fold_libraries", True) and not torch_style else ()
        self.monitor = Monitoring(c_calls) if USE_MONITORING else None
        if self.monitor is not None:
            self.monitor.on()  # before the stacks are seeded: on()'s own return is not one of theirs
        elif not torch_style:  # (torch's tracer does not see threads started while it records either)
            self.previous = threading.getprofile() if hasattr(threading, "getprofile") else None
            threading.setprofile(self.tracer.pytrace_thread_hook)  # new threads (first, so that it is not traced)
        module_code = python_calls.module_call_code() if torch_style else None
        self.tracer.pytrace_start(int(float(o.get("min_duration_us") or 0) * 1000), int(o.get("max_depth") or 128),
                                    c_calls, fold, (POLYPROF_FILES,), _thread_name,
                                    {t.native_id: t.name for t in threading.enumerate() if t.native_id},
                                    self.monitor is not None, torch_style, module_code)
        self.running = True

    def stop(self) -> None:
        if not self.running:
            return
        self.running = False
        if self.monitor is not None:
            self.monitor.off()
        self.buffers = self.tracer.pytrace_stop()
        if self.monitor is None:
            if not self.torch_style:
                threading.setprofile(self.previous)
            sys.setprofile(None)  # this thread's Python-level hook, if the bootstrap left one

    def collect(self, sink: Sink) -> None:
        buffers, self.buffers = self.buffers, []
        include, exclude = self.opts.get("include") or [], self.opts.get("exclude") or []
        taken = [t for t in (buf.take() for buf in buffers) if not str(t[1]).startswith("polyprof-")]  # not polyprof's own threads
        if self.torch_style:
            keep = (lambda obj, label: _wanted(obj, label, include, exclude)) if include or exclude else None
            table = python_calls.collect_torch_style(taken, sink, sink.host_device(), keep)
            if table is not None:
                self.ctx.report.attach(PYTHON_CALLS, table)
        else:
            lost = sum(_hand_over(sink, tid, name, code, start, end, objects, include, exclude)
                       for tid, name, code, start, end, _depth, _kind, objects, *_ in taken)
            if lost:
                self.ctx.report.filtered_records(lost, "python calls whose code object the tracer did not keep")
        short, deep = sum(t[8] for t in taken), sum(t[9] for t in taken)
        if short:
            self.ctx.report.filtered_records(short, "python calls shorter than min_duration_us")
        if deep:
            self.ctx.report.filtered_records(deep, "python frames deeper than max_depth")

    def close(self) -> None:
        self.stop()


def _hand_over(sink: Sink, tid: int, name: Any, code: bytes, start: bytes, end: bytes, objects: Any,
               include: list[str], exclude: list[str]) -> int:
    """One thread's rows, polyprof's own style: named ``file.py(12): qualname``, filtered by include/exclude.
    `objects`: the tracer's, address -> object. Returns how many rows were left out because their code
    object is not among those the tracer kept (it can no longer be named; none is expected)."""
    codes = np.frombuffer(code, np.int64)
    if not len(codes):
        return 0
    by_id = objects
    starts, ends = np.frombuffer(start, np.int64), np.frombuffer(end, np.int64)
    known = np.fromiter((c in by_id for c in codes.tolist()), bool, len(codes))
    lost = int(len(codes) - known.sum())
    if lost:
        codes, starts, ends = codes[known], starts[known], ends[known]
        if not len(codes):
            return lost
    uniq, inverse = np.unique(codes, return_inverse=True)
    labels = [slice_name(by_id[int(u)]) for u in uniq.tolist()]
    keep = np.ones(len(codes), bool)
    if include or exclude:
        wanted = np.array([_wanted(by_id[int(u)], label, include, exclude) for u, label in zip(uniq.tolist(), labels, strict=True)])
        keep = wanted[inverse]
    rows = np.flatnonzero(keep)
    sink.activities({
        "kind": np.full(len(rows), int(ActivityKind.PYTHON_FUNCTION)),
        "cat": ["python_function"] * len(rows),
        "name": CodedStrings(inverse[rows], labels),
        "device": np.full(len(rows), sink.host_device()),
        "resource": np.full(len(rows), sink.host_thread(int(tid), name)),
        "start": starts[rows],
        "end": ends[rows],
    })
    return lost


def _thread_name() -> str | None:
    """This thread's name, None while threading does not know it yet (its bootstrap's first frames)."""
    thread = threading._active.get(threading.get_ident())  # type: ignore[attr-defined]
    return thread.name if thread is not None else None


def _wanted(obj: Any, label: str, include: list[str], exclude: list[str]) -> bool:
    file = getattr(obj, "co_filename", "")
    name = getattr(obj, "co_qualname", None) or getattr(obj, "co_name", None) or label
    match = lambda pats: any(fnmatch.fnmatch(file, p) or fnmatch.fnmatch(name, p) for p in pats)  # noqa: E731
    return (not include or match(include)) and not match(exclude)


class PythonBackend:
    name = "python"
    api_version = API_VERSION
    activities = frozenset({"PYTHON"})
    options = OPTIONS
    traits = BackendTraits(in_process=True, on_by_default=False)  # tracing every call has a cost: only when asked for by name

    def probe(self) -> Availability:
        from polyprof import _native

        why = _native.unavailable("the Python call tracer")
        if why is not None:
            return Availability.no(why)
        return Availability.yes(devices=["host process"], python=sys.version.split()[0])

    def create_session(self, config: ProfileConfig, ctx: SessionContext) -> PythonSession:
        return PythonSession(config, ctx)


backend = PythonBackend()
