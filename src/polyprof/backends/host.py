"""The ``host`` backend: turns what ``polyprof.record_function``, ``polyprof.instant`` and
``polyprof.counter`` recorded into activities on the host process (activity group CPU)."""

from __future__ import annotations

import gc
import platform
from typing import Any

from polyprof import annotations
from polyprof.plugin.backend import API_VERSION, Availability, ProfileConfig, SessionContext
from polyprof.plugin.clock import host_ns
from polyprof.plugin.options import OptionSchema
from polyprof.plugin.recorder_rows import thread_rows, unfinished_spans
from polyprof.plugin.sink import Sink
from polyprof.plugin.traits import BackendTraits, SessionTraits


class HostSession:
    # polyprof's own in-process bookkeeping cannot hang, so the engine calls it directly instead of
    # on a guard thread (whose start can wait milliseconds for a CPU under load)
    traits = SessionTraits(in_process=True)

    def __init__(self, config: ProfileConfig, ctx: SessionContext) -> None:
        self.ctx = ctx
        self.gc_events = bool(config.extra.get("record_python_gc_info"))
        self._running = False
        self._gc_start: dict[int, int] = {}
        self._taken: list[annotations.ThreadBuffer] = []

    def prepare(self) -> None:
        pass

    def start(self) -> None:
        annotations.recorder.begin()
        self._running = True
        from polyprof import _native

        self.ctx.report.clock_offset("host", {"clock": "CLOCK_MONOTONIC", "read through": _native.clock_source()})
        self.ctx.report.detail("recorder", _native.description())
        if _native.extension_missing:
            self.ctx.report.warning(f"spans, instants and counters cost several times more: {_native.why_pure}")
        if self.gc_events:
            gc.callbacks.append(self._on_gc)

    def stop(self) -> None:
        """Recording ends and every thread's events change hands (a pointer swap per thread): the
        conversion happens in collect, on the background writer."""
        if self._running:
            annotations.recorder.end()
            self._running = False
            self._taken = annotations.recorder.take()  # with the states of the spans still open
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        """Each garbage collection as a "Python GC" python_function span on the collecting thread, as
        torch.profiler records it with record_python_gc_info."""
        import threading

        tid = threading.get_native_id()
        if phase == "start":
            self._gc_start[tid] = host_ns()
        elif phase == "stop" and tid in self._gc_start and annotations.recorder.active:
            start = self._gc_start.pop(tid)
            annotations.recorder.buffer().add(
                annotations.GC, start, host_ns(), "Python GC", 0, 0, {"generation": info.get("generation")}
            )

    def flush(self, sink: Sink) -> None:
        """While recording: hand over every event completed so far (spans still open stay with their
        threads and come in a later flush or at collect)."""
        if self._running:
            self._convert(sink, annotations.recorder.take())

    def collect(self, sink: Sink) -> None:
        taken, self._taken = self._taken, []
        self._convert(sink, taken, unfinished=True)

    def unfinished_now(self, sink: Sink, end_ns: int) -> None:
        """While recording: the spans open now on every thread, written up to `end_ns` with
        ``"finished": false`` (a dump's view of the step or annotation a hang is stuck in)."""
        if self._running:
            host = sink.host_device()
            for buf in annotations.recorder.buffers():
                states = annotations.open_states(buf.events)
                unfinished_spans(sink, host, sink.host_thread(buf.tid, buf.name), states, end_ns)

    def _convert(self, sink: Sink, taken: list[annotations.ThreadBuffer], unfinished: bool = False) -> None:
        host = sink.host_device()
        for buf in taken:
            if unfinished:
                unfinished_spans(sink, host, sink.host_thread(buf.tid, buf.name), buf.events.open_spans(),
                                 self.ctx.window_end)
            rows, names, args = annotations.snapshot(buf.events)
            buf.events = None  # the columns below are all that is kept
            if len(rows):
                thread_rows(sink, host, sink.host_thread(buf.tid, buf.name), rows, names, args)

    def close(self) -> None:
        self.stop()


class HostBackend:
    """Always available: it needs nothing but Python."""

    name = "host"
    api_version = API_VERSION
    activities = frozenset({"CPU"})
    #: record_function spans follow the context: asyncio tasks may interleave them on one thread
    traits = BackendTraits(context_scoped_spans=True, in_process=True)  # polyprof's own: probe and create_session are called directly, without a guard thread
    options = OptionSchema()  # none: an unknown key is an error, not ignored

    def probe(self) -> Availability:
        from polyprof import _native

        return Availability.yes(devices=["host process"], python=platform.python_version(), recorder=_native.description())

    def create_session(self, config: ProfileConfig, ctx: SessionContext) -> HostSession:
        return HostSession(config, ctx)


backend = HostBackend()
