"""The ``pvti`` backend: PopVision Trace Instrumentation's host tracepoints (``libpvti``, in the Poplar
SDK) on polyprof's timeline, as they happen (activity group IPU).

::

    import libpvti as pvti
    channel = pvti.createTraceChannel("MNIST")
    with polyprof.profile(["cpu", "ipu"]) as prof:
        with pvti.Tracepoint(channel, "epoch 0"):    # a user_annotation span, category "pvti:MNIST"
            train()
        pvti.Tracepoint.event(channel, "checkpoint")  # an instant
        loss_series.add(0.25)                         # a counter sample "Loss.Training Loss"

PVTI writes its own trace files for the System Analyser and has no reader polyprof could use, so while a
profile records the backend wraps ``libpvti``'s entry points (``Tracepoint``, ``Tracepoint.event``,
``createTraceChannel``, ``Graph.addSeries`` and each series' ``add``): every call still reaches
libpvti, and also leaves a row here. Code that took ``Tracepoint`` out of the module before the profile
started (``from libpvti import Tracepoint``) calls the original and is not seen; channels created
before the profile are named by what libpvti says of them, or ``pvti``. Nothing is wrapped when libpvti
is not importable; it is imported only where ``PVTI_OPTIONS`` is set (as PopTorch does) or the program
imported it. **Not yet run with the Poplar SDK**: tested against a stand-in module shaped after the
documented libpvti Python API.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import time
from typing import Any

from polyprof.plugin import API_VERSION, ActivityKind, Availability, ProfileConfig, SessionContext, Sink

MODULE = "libpvti"


def _module() -> Any | None:
    """libpvti, if the program imported it or PVTI_OPTIONS asks for tracepoints; else None."""
    if MODULE in sys.modules:
        return sys.modules[MODULE]
    if os.environ.get("PVTI_OPTIONS") is None:
        return None
    try:
        return importlib.import_module(MODULE)
    except ImportError:
        return None


class PvtiSession:
    """Wraps libpvti's entry points between start and stop (see the module docstring)."""

    def __init__(self, config: ProfileConfig, ctx: SessionContext) -> None:
        self.ctx = ctx
        self.pvti: Any = None
        self.saved: list[tuple[Any, str, Any]] = []
        self.channel_names: dict[int, str] = {}
        self.series_names: dict[int, str] = {}
        self.spans: list[tuple[int, int, int, str, str]] = []  # start, end, thread, channel, label
        self.instants: list[tuple[int, int, str, str]] = []
        self.samples: list[tuple[int, str, float]] = []
        self.recording = False
        self._lock = threading.Lock()

    def prepare(self) -> None:
        self.pvti = _module()
        if self.pvti is None:
            self.ctx.report.detail("libpvti", "not imported by the program (and PVTI_OPTIONS unset): nothing to wrap")

    def start(self) -> None:
        if self.pvti is None or self.recording:
            return
        self.recording = True
        self._wrap()

    def stop(self) -> None:
        if not self.recording:
            return
        self.recording = False
        for owner, name, original in reversed(self.saved):
            setattr(owner, name, original)
        self.saved = []

    def close(self) -> None:
        self.stop()

    # -- the wrappers -------------------------------------------------------------------------------
    def _replace(self, owner: Any, name: str, replacement: Any) -> None:
        self.saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, replacement)

    def _channel(self, channel: Any) -> str:
        name = self.channel_names.get(id(channel))
        if name is None:
            name = str(getattr(channel, "name", "") or "pvti")
        return name

    def _wrap(self) -> None:
        pvti, session = self.pvti, self
        original_tracepoint = pvti.Tracepoint

        if hasattr(pvti, "createTraceChannel"):
            create = pvti.createTraceChannel

            def create_trace_channel(name: str, *args: Any, **kwargs: Any) -> Any:
                channel = create(name, *args, **kwargs)
                session.channel_names[id(channel)] = str(name)
                return channel

            self._replace(pvti, "createTraceChannel", create_trace_channel)

        class Tracepoint:
            """libpvti's Tracepoint, also recorded by polyprof (see polyprof_ipu.pvti_backend)."""

            def __init__(self, channel: Any, label: str, *args: Any, **kwargs: Any) -> None:
                self._inner = original_tracepoint(channel, label, *args, **kwargs)
                self._what = (session._channel(channel), str(label))

            def __enter__(self) -> Any:
                self._start = time.perf_counter_ns()
                entered = self._inner.__enter__()
                return self if entered is self._inner else entered  # its exit comes back here

            def __exit__(self, *exc: Any) -> Any:
                try:
                    return self._inner.__exit__(*exc)
                finally:
                    session._span(self._start, time.perf_counter_ns(), *self._what)

            @staticmethod
            def event(channel: Any, label: str, *args: Any, **kwargs: Any) -> Any:
                result = original_tracepoint.event(channel, label, *args, **kwargs)
                session._instant(time.perf_counter_ns(), session._channel(channel), str(label))
                return result

            def __getattr__(self, name: str) -> Any:
                return getattr(self._inner, name)

        for name in ("begin", "end"):  # other static helpers stay libpvti's
            if hasattr(original_tracepoint, name):
                setattr(Tracepoint, name, staticmethod(getattr(original_tracepoint, name)))
        self._replace(pvti, "Tracepoint", Tracepoint)
        graph = getattr(pvti, "Graph", None)
        if graph is not None and hasattr(graph, "addSeries"):
            add_series = graph.addSeries

            def tracked_add_series(graph_self: Any, name: str, *args: Any, **kwargs: Any) -> Any:
                series = add_series(graph_self, name, *args, **kwargs)
                title = str(getattr(graph_self, "name", "") or "pvti")
                session.series_names[id(series)] = f"{title}.{name}"
                session._wrap_series(type(series))
                return series

            self._replace(graph, "addSeries", tracked_add_series)

    def _wrap_series(self, series_type: Any) -> None:
        if any(owner is series_type and name == "add" for owner, name, _ in self.saved):
            return
        original_add, session = series_type.add, self

        def add(series_self: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
            result = original_add(series_self, value, *args, **kwargs)
            name = session.series_names.get(id(series_self))
            if name is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
                with session._lock:
                    session.samples.append((time.perf_counter_ns(), name, float(value)))
            return result

        try:
            self._replace(series_type, "add", add)
        except (AttributeError, TypeError):  # a type that cannot be patched: its samples are not seen
            self.ctx.report.detail("pvti series", "libpvti's series type cannot be wrapped: samples not recorded")

    def _span(self, start: int, end: int, channel: str, label: str) -> None:
        with self._lock:
            self.spans.append((start, end, threading.get_native_id(), channel, label))

    def _instant(self, ts: int, channel: str, label: str) -> None:
        with self._lock:
            self.instants.append((ts, threading.get_native_id(), channel, label))

    # -- collect ------------------------------------------------------------------------------------
    def collect(self, sink: Sink) -> None:
        with self._lock:
            spans, instants, samples = self.spans, self.instants, self.samples
            self.spans, self.instants, self.samples = [], [], []
        host = sink.host_device()
        rows: dict[int, int] = {}

        def row(tid: int) -> int:
            if tid not in rows:
                rows[tid] = sink.host_thread(tid)
            return rows[tid]

        for start, end, tid, channel, label in spans:
            sink.activity(ActivityKind.USER_ANNOTATION, label, device=host, resource=row(tid), start=start, end=end,
                          cat=f"pvti:{channel}")
        for ts, tid, channel, label in instants:
            sink.activity(ActivityKind.INSTANT, label, device=host, resource=row(tid), start=ts, end=ts,
                          cat=f"pvti:{channel}")
        for ts, name, value in samples:
            sink.counter(name, value, ts=ts, device=host)


class PvtiBackend:
    name = "pvti"
    api_version = API_VERSION
    activities = frozenset({"IPU"})

    def probe(self) -> Availability:
        pvti = _module()
        if pvti is None:
            return Availability.no(
                "libpvti is not imported here: it comes with the Poplar SDK (source its enable.sh) and is "
                "read only when the program imports it or PVTI_OPTIONS is set; the Poplar SDK is legacy"
            )
        if not hasattr(pvti, "Tracepoint"):
            return Availability.no(f"{MODULE} has no Tracepoint: not PopVision Trace Instrumentation")
        return Availability.yes(devices=["host tracepoints (libpvti)"])

    def create_session(self, config: ProfileConfig, ctx: SessionContext) -> PvtiSession:
        return PvtiSession(config, ctx)


backend = PvtiBackend()
